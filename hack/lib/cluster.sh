# shellcheck shell=bash
# Functions shared by the machine's cluster scripts, demo/clusters/local/cluster.sh
# and hack/scale/cluster.sh, which source this file (by its path relative to
# their own). The caller sets, before calling them:
#   CLUSTER_LOG_PREFIX  the word log and die start their lines with ("cluster")
#   CLUSTER_NAME        the cluster's and context's name in kubeconfigs
#   STATE               the state dir (pids/, logs/, pki/)
#   APISERVER_PORT      kube-apiserver's port on 127.0.0.1
#   SERVICE_CIDR        the service range (its .1 is in the serving cert)
# and, for the control-plane starters (start_etcd and the rest):
#   ETCD_PORT           etcd's client port on 127.0.0.1
#   ETCD_PEER_PORT      etcd's peer port on 127.0.0.1
#   UP_TIMEOUT          seconds to wait for etcd and kube-apiserver

log() { echo "$CLUSTER_LOG_PREFIX: $*" >&2; }
die() { echo "$CLUSTER_LOG_PREFIX: error: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# pids: every process we start is recorded as $STATE/pids/<name> = "<pid> <binary>".
# A pid counts as ours only while /proc/<pid>/exe is still that binary, so a reused
# pid is never signalled.

pidfile() { echo "$STATE/pids/$1"; }

# alive NAME: prints the pid if NAME's recorded process is still ours and running.
alive() {
  local f pid exe
  f=$(pidfile "$1")
  [ -r "$f" ] || return 1
  read -r pid exe <"$f" || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] || return 1
  echo "$pid"
}

# STARTED: the components this invocation started, in order.
STARTED=()

# start NAME BINARY ARGS...: runs BINARY in its own session, log in $STATE/logs.
start() {
  local name=$1 bin=$2
  shift 2
  if alive "$name" >/dev/null; then
    log "$name already running"
    return 0
  fi
  setsid "$bin" "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo "$! $(readlink -f "$bin")" >"$(pidfile "$name")"
  STARTED+=("$name")
}

# stop_pid PID WHAT [SECONDS]: SIGTERM, wait up to SECONDS (30), then SIGKILL.
stop_pid() {
  local pid=$1 what=$2 wait=${3:-30} i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < wait * 5; i++)); do
    [ -d "/proc/$pid" ] || return 0
    # A zombie child of ours is gone for our purposes.
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && return 0
    sleep 0.2
  done
  log "$what (pid $pid) did not stop in ${wait}s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

# stop NAME [SECONDS]: stops NAME's recorded process if it is still ours, and
# forgets it.
stop() {
  local name=$1 wait=${2:-30} pid
  if pid=$(alive "$name"); then
    log "stopping $name (pid $pid)"
    stop_pid "$pid" "$name" "$wait"
  fi
  rm -f "$(pidfile "$name")"
}

# stop_in_reverse NAME...: stops each NAME, the last one first (NAMEs in start order).
stop_in_reverse() {
  local names=("$@") i
  for ((i = ${#names[@]} - 1; i >= 0; i--)); do
    stop "${names[i]}" 30
  done
}

# print_status NAME...: a line per NAME, "NAME: running (pid PID)" or "NAME: stopped";
# fails if any is stopped.
print_status() {
  local n pid rc=0
  for n in "$@"; do
    if pid=$(alive "$n"); then echo "$n: running (pid $pid)"; else echo "$n: stopped"; rc=1; fi
  done
  return "$rc"
}

# wait_for WHAT SECONDS CMD...: polls CMD every second until it succeeds.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  die "timed out after ${secs}s waiting for $what (logs: $STATE/logs/)"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ---------------------------------------------------------------------------
# Credentials: one CA for serving certs (and the kubelet client cert), static
# tokens for the admin and the control-plane components, an RSA key for service
# accounts.

# gen_pki CA_CN DNS_SANS [NODE]: writes $STATE/pki once. DNS_SANS are the serving
# cert's names after its IPs ("DNS:localhost,DNS:kubernetes"). With NODE, also the
# apiserver's kubelet client cert and a token for system:node:NODE.
gen_pki() {
  local p=$STATE/pki ca_cn=$1 dns_sans=$2 node=${3:-}
  [ -s "$p/tokens.csv" ] && return 0
  mkdir -p "$p"
  (
    cd "$p" || exit 1
    openssl genrsa -out ca.key 2048 2>/dev/null
    openssl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=$ca_cn" -out ca.crt 2>/dev/null

    openssl genrsa -out apiserver.key 2048 2>/dev/null
    openssl req -new -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr 2>/dev/null
    printf '%s\n' "subjectAltName=IP:127.0.0.1,IP:${SERVICE_CIDR%.*}.1,$dns_sans" \
      "extendedKeyUsage=serverAuth" >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -sha256 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null

    if [ -n "$node" ]; then
      # The apiserver's identity towards the kubelet (logs, exec).
      openssl genrsa -out kubelet-client.key 2048 2>/dev/null
      openssl req -new -key kubelet-client.key -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
        -out kubelet-client.csr 2>/dev/null
      echo "extendedKeyUsage=clientAuth" >client.ext
      openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -sha256 \
        -extfile client.ext -out kubelet-client.crt 2>/dev/null
    fi

    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

    tok() { openssl rand -hex 16; }
    {
      echo "$(tok),admin,admin,system:masters"
      echo "$(tok),system:kube-scheduler,system:kube-scheduler"
      echo "$(tok),system:kube-controller-manager,system:kube-controller-manager"
      if [ -n "$node" ]; then echo "$(tok),system:node:$node,system:node:$node,system:nodes"; fi
    } >tokens.csv.tmp
    chmod 600 ./*.key tokens.csv.tmp
    mv tokens.csv.tmp tokens.csv
  )
}

# kubeconfig_for FILE USER: a kubeconfig for USER's static token.
kubeconfig_for() {
  local file=$1 user=$2 token
  token=$(awk -F, -v u="$user" '$2 == u {print $1}' "$STATE/pki/tokens.csv")
  [ -n "$token" ] || die "no token for $user in $STATE/pki/tokens.csv"
  cat >"$file" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: $CLUSTER_NAME
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $STATE/pki/ca.crt
users:
- name: $user
  user:
    token: $token
contexts:
- name: $CLUSTER_NAME
  context: {cluster: $CLUSTER_NAME, user: "$user"}
current-context: $CLUSTER_NAME
KUBECONFIG
  chmod 600 "$file"
}

# webhook_client_config DIR HOSTPORT...: the API server's identity towards
# admission webhooks, written once: a CA of its own (DIR/webhook-client-ca.crt,
# which a webhook trusts), a client certificate for CN kube-apiserver, a
# kubeconfig whose users are named after each webhook HOSTPORT (the API server
# picks the user by the webhook's host:port, or host for port 443:
# k8s.io/apiserver's webhook authentication resolver) and the
# AdmissionConfiguration naming it for validating and mutating webhooks
# (DIR/admission.yaml, for --admission-control-config-file).
webhook_client_config() {
  local d=$1 hp
  shift
  mkdir -p "$d"
  if [ ! -s "$d/webhook-client.crt" ]; then
    (
      cd "$d" || exit 1
      openssl genrsa -out webhook-client-ca.key 2048 2>/dev/null
      openssl req -x509 -new -key webhook-client-ca.key -sha256 -days 30 -subj "/CN=tessera-local-webhook-client-ca" \
        -out webhook-client-ca.crt 2>/dev/null
      openssl genrsa -out webhook-client.key 2048 2>/dev/null
      openssl req -new -key webhook-client.key -subj "/CN=kube-apiserver" -out webhook-client.csr 2>/dev/null
      echo "extendedKeyUsage=clientAuth" >webhook-client.ext
      openssl x509 -req -in webhook-client.csr -CA webhook-client-ca.crt -CAkey webhook-client-ca.key -CAcreateserial \
        -days 30 -sha256 -extfile webhook-client.ext -out webhook-client.crt 2>/dev/null
      chmod 600 ./*.key
    )
  fi
  {
    echo "apiVersion: v1"
    echo "kind: Config"
    echo "users:"
    for hp in "$@"; do
      echo "- name: '$hp'"
      echo "  user: {client-certificate: $d/webhook-client.crt, client-key: $d/webhook-client.key}"
    done
  } >"$d/webhook-client.kubeconfig"
  chmod 600 "$d/webhook-client.kubeconfig"
  cat >"$d/admission.yaml" <<ADMISSION
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $d/webhook-client.kubeconfig
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $d/webhook-client.kubeconfig
ADMISSION
}

# ---------------------------------------------------------------------------
# The control plane, on 127.0.0.1: what both clusters start alike. Each starter
# takes the bin dir of the built binaries, then the flags only its caller passes.

# start_etcd BIN NAME ARGS...: a single-member etcd NAME, data in $STATE/etcd; waits
# for its /health.
start_etcd() {
  local bin=$1 name=$2
  shift 2
  log "starting etcd on 127.0.0.1:$ETCD_PORT"
  start etcd "$bin/etcd" --name "$name" --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "$name=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level warn "$@"
  wait_for etcd "$UP_TIMEOUT" curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
}

# start_apiserver BIN ARGS...: kube-apiserver on $APISERVER_PORT with the
# credentials of gen_pki; waits for its /readyz.
start_apiserver() {
  local bin=$1 p=$STATE/pki
  shift
  log "starting kube-apiserver on 127.0.0.1:$APISERVER_PORT"
  # No --advertise-address: a loopback one is refused (LOCAL-CLUSTER.md).
  start kube-apiserver "$bin/kube-apiserver" \
    --bind-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
    --client-ca-file "$p/ca.crt" --token-auth-file "$p/tokens.csv" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --profiling=false "$@"
  wait_for "kube-apiserver /readyz" "$UP_TIMEOUT" \
    curl -fsS --cacert "$p/ca.crt" "https://127.0.0.1:$APISERVER_PORT/readyz"
}

# start_controller_manager BIN ARGS...: kube-controller-manager on port 10257, as
# system:kube-controller-manager ($STATE/controller-manager.kubeconfig).
start_controller_manager() {
  local bin=$1 p=$STATE/pki
  shift
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10257 --leader-elect=false \
    --use-service-account-credentials --service-account-private-key-file "$p/sa.key" \
    --root-ca-file "$p/ca.crt" --service-cluster-ip-range "$SERVICE_CIDR" "$@"
}

# start_scheduler BIN ARGS...: kube-scheduler on port 10259, checking its callers as
# system:kube-scheduler ($STATE/scheduler.kubeconfig). ARGS say how it reaches the
# apiserver (--kubeconfig, or a --config file).
start_scheduler() {
  local bin=$1
  shift
  start kube-scheduler "$bin/kube-scheduler" "$@" \
    --authentication-kubeconfig "$STATE/scheduler.kubeconfig" \
    --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10259
}
