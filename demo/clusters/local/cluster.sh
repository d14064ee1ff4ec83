#!/usr/bin/env bash
# A one-node Kubernetes 1.37 cluster on this machine, without Docker: etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager, containerd + runc, the
# kubelet, bridge CNI and an in-memory image registry, all on 127.0.0.1. Needs
# root (the kubelet and runc do).
#
#   cluster.sh up          build the tools if needed (build-tools.sh), start everything,
#                          push the pause and busybox images, wait for the node Ready
#   cluster.sh down        stop exactly the processes `up` started (pids in the state
#                          dir), unmount and delete the state dir, and delete
#                          /var/lib/kubelet, /var/log/pods and /var/run/cdi where `up`
#                          created them
#   cluster.sh status      which components run, and the node
#   cluster.sh kubeconfig  print the admin kubeconfig's path
#   cluster.sh env         print `export` lines: KUBECONFIG, PATH (kubectl), TESSERA_REGISTRY
#
# Environment (defaults in brackets):
#   TESSERA_STATE_DIR        everything the cluster writes [/tmp/tessera-local]
#   TESSERA_CACHE_DIR        built binaries, see build-tools.sh [~/.cache/tessera]
#   TESSERA_REGISTRY_PORT    in-memory registry on 127.0.0.1 [5000]
#   TESSERA_APISERVER_PORT   kube-apiserver on 127.0.0.1 [6443]
#   TESSERA_ETCD_PORT        etcd client port on 127.0.0.1; peer port is +1 [2379]
#   TESSERA_WEBHOOK_PORT     the webhook's port on 127.0.0.1 (install.sh's), which
#                            the API server sends its webhook client certificate to [9443]
#   TESSERA_POD_CIDR         bridge CNI subnet [10.244.0.0/24]
#   TESSERA_UP_TIMEOUT       seconds to wait for each component [180]
#
# The kubelet uses the standard root dir /var/lib/kubelet, so a DRA driver's
# DaemonSet (plugins/, plugins_registry/) works unchanged; pod logs are in
# /var/log/pods. Images: the registry mirrors every registry (containerd's
# certs.d/_default), so `docker.io/library/busybox:1.36` is served from it.
set -euo pipefail

here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
repo=$(cd "$here/../../.." && pwd)
[ -r "$repo/hack/lib/cluster.sh" ] || { echo "$0: $repo/hack/lib/cluster.sh is missing: run this script from a Tessera checkout" >&2; exit 1; }
# shellcheck source=SCRIPTDIR/../../../hack/lib/cluster.sh
. "$repo/hack/lib/cluster.sh"
CLUSTER_LOG_PREFIX=cluster
CLUSTER_NAME=tessera-local

STATE=${TESSERA_STATE_DIR:-/tmp/tessera-local}
REGISTRY_PORT=${TESSERA_REGISTRY_PORT:-5000}
APISERVER_PORT=${TESSERA_APISERVER_PORT:-6443}
ETCD_PORT=${TESSERA_ETCD_PORT:-2379}
WEBHOOK_PORT=${TESSERA_WEBHOOK_PORT:-9443}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
POD_CIDR=${TESSERA_POD_CIDR:-10.244.0.0/24}
UP_TIMEOUT=${TESSERA_UP_TIMEOUT:-180}
REGISTRY=127.0.0.1:$REGISTRY_PORT
PAUSE_IMAGE=$REGISTRY/pause:3.10
SERVICE_CIDR=10.0.0.0/24
KUBELET_ROOT=/var/lib/kubelet
POD_LOGS=/var/log/pods
CDI_DIR=/var/run/cdi
BRIDGE=tessera0
MARKER=.tessera-local-cluster
# Start order; `down` stops in reverse.
COMPONENTS=(registry etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet)

# ---------------------------------------------------------------------------

prereqs() {
  [ "$(id -u)" = 0 ] || die "must run as root (the kubelet, containerd and runc need it)"
  local t
  for t in go openssl sed awk setsid mountpoint ip curl ldd; do
    command -v "$t" >/dev/null || die "missing '$t' (install it: apt-get install -y $(debpkg "$t"))"
  done
  [ -x /usr/lib/cni/bridge ] || die "missing CNI plugins (apt-get install -y containernetworking-plugins)"
  [ -x /bin/busybox ] || die "missing /bin/busybox (apt-get install -y busybox-static)"
  grep -q overlay /proc/filesystems || modprobe overlay 2>/dev/null ||
    die "the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)"
}

debpkg() {
  case $1 in
    go) echo "golang (or Go 1.26 from go.dev)" ;;
    setsid) echo util-linux ;;
    mountpoint) echo util-linux ;;
    ip) echo iproute2 ;;
    ldd) echo libc-bin ;;
    awk) echo gawk ;;
    *) echo "$1" ;;
  esac
}

tools() {
  [ -n "${BIN:-}" ] && return 0
  BIN=$("$here/build-tools.sh" | tail -n1)
  [ -x "$BIN/kube-apiserver" ] || die "build-tools.sh did not produce $BIN/kube-apiserver"
}

# node_name: the host name if it resolves to loopback (then `kubectl logs` reaches the
# kubelet, which listens on 127.0.0.1, through the node's Hostname address).
node_name() {
  local h
  h=$(hostname | tr '[:upper:]' '[:lower:]')
  if getent ahostsv4 "$h" 2>/dev/null | awk '{print $1}' | grep -qx '127\.[0-9.]*'; then
    echo "$h"
  else
    echo ""
  fi
}

# ---------------------------------------------------------------------------
# Config files.

write_containerd_config() {
  local c=$STATE/containerd
  mkdir -p "$c/certs.d/_default" "$c/certs.d/$REGISTRY" "$STATE/cni/net.d" "$STATE/bin"

  # Trap 1 in LOCAL-CLUSTER.md: this host refuses a negative oom_score_adj, and the
  # kubelet asks for one on every sandbox (and Guaranteed containers). The wrapper
  # clamps it to 0 in the OCI spec (bundle config.json, or exec's process.json)
  # and execs the real runc. Only sed is needed.
  cat >"$STATE/bin/runc" <<EOF
#!/bin/sh
# Generated by cluster.sh: clamp negative oomScoreAdj to 0, then run runc.real.
prev=""
for a in "\$@"; do
  case "\$prev" in
    --bundle|-b) f="\$a/config.json"; [ -f "\$f" ] && sed -i -E 's/("oomScoreAdj"[[:space:]]*:[[:space:]]*)-[0-9]+/\\10/' "\$f" ;;
    --process|-p) [ -f "\$a" ] && sed -i -E 's/("oomScoreAdj"[[:space:]]*:[[:space:]]*)-[0-9]+/\\10/' "\$a" ;;
  esac
  case "\$a" in
    --bundle=*) f="\${a#--bundle=}/config.json"; [ -f "\$f" ] && sed -i -E 's/("oomScoreAdj"[[:space:]]*:[[:space:]]*)-[0-9]+/\\10/' "\$f" ;;
    --process=*) f="\${a#--process=}"; [ -f "\$f" ] && sed -i -E 's/("oomScoreAdj"[[:space:]]*:[[:space:]]*)-[0-9]+/\\10/' "\$f" ;;
  esac
  prev="\$a"
done
exec "$BIN/runc.real" "\$@"
EOF
  chmod 755 "$STATE/bin/runc"

  # Every registry is served by the local one (there is no other here).
  local h
  for h in "$c/certs.d/_default/hosts.toml" "$c/certs.d/$REGISTRY/hosts.toml"; do
    cat >"$h" <<EOF
server = "http://$REGISTRY"

[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve", "push"]
  skip_verify = true
EOF
  done

  cat >"$c/config.toml" <<EOF
version = 3
root = "$c/root"
state = "$c/state"
oom_score = 0

[grpc]
  address = "$c/containerd.sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "$c/certs.d"

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$STATE/bin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$STATE/cni/net.d"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF

  cat >"$STATE/cni/net.d/10-tessera.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "tessera-local",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
}

write_kubelet_config() {
  cat >"$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://$STATE/containerd/containerd.sock
# This host: cgroup v1 + v2 hybrid, no systemd, swap tolerated, no QoS hierarchy.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
# The host refuses negative oom_score_adj (LOCAL-CLUSTER.md, trap 1).
oomScoreAdj: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization:
  mode: Webhook
podLogsDir: $POD_LOGS
resolvConf: /etc/resolv.conf
serializeImagePulls: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
maxPods: 50
EOF
}

# ---------------------------------------------------------------------------

images() {
  # The pause binary and the image builder live in the main module.
  log "building the pause binary and imagebuild"
  (cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$STATE/build/pause" ./demo/clusters/local/pause &&
    go build -trimpath -o "$STATE/build/imagebuild" ./demo/clusters/local/imagebuild)
  "$STATE/build/imagebuild" --ref "$PAUSE_IMAGE" --file "$STATE/build/pause:/pause" --entrypoint /pause >&2
  local a args=(--file /bin/busybox:/bin/busybox)
  for a in $(/bin/busybox --list); do
    [ "$a" = busybox ] || args+=(--symlink "/bin/$a:busybox")
  done
  # Served for docker.io/library/busybox:1.36 too, through the _default mirror.
  local ref
  for ref in "$REGISTRY/library/busybox:1.36" "$REGISTRY/library/busybox:latest"; do
    "$STATE/build/imagebuild" --ref "$ref" "${args[@]}" --arg sh >&2
  done
}

node_ready() {
  [ "$("$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" get node "$NODE" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

cmd_up() {
  prereqs
  if alive kube-apiserver >/dev/null && alive kubelet >/dev/null; then
    log "already up ($STATE); KUBECONFIG=$STATE/admin.kubeconfig"
    return 0
  fi
  local t0=$SECONDS
  tools
  NODE=$(node_name)
  [ -n "$NODE" ] || die "the host name '$(hostname)' does not resolve to 127.x; add '127.0.1.1 $(hostname)' to /etc/hosts so the node's Hostname address reaches the kubelet on loopback"

  # Only one local cluster per machine: the kubelet's root dir is the host's.
  if [ -d "$KUBELET_ROOT" ] && [ ! -e "$KUBELET_ROOT/$MARKER" ]; then
    die "$KUBELET_ROOT exists and was not created by cluster.sh; is another kubelet on this machine? (remove it if not)"
  fi
  if ! alive registry >/dev/null; then
    local port
    for port in "$REGISTRY_PORT" "$APISERVER_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT" 10248 10250 10257 10259; do
      port_free "$port" || die "127.0.0.1:$port is in use (set TESSERA_*_PORT, or stop what uses it)"
    done
  fi

  mkdir -p "$STATE"/{pids,logs,etcd,kubelet,build,containerd}
  # Host dirs this cluster creates are listed in $STATE/owned; `down` deletes only
  # those. (The kubelet prunes unknown entries in /var/log/pods, so a marker file
  # there would not survive; the one in its root dir does.)
  local d
  for d in "$KUBELET_ROOT" "$POD_LOGS" "$CDI_DIR"; do
    if [ ! -e "$d" ]; then
      mkdir -p "$d"
      echo "$d" >>"$STATE/owned"
    fi
  done
  touch "$KUBELET_ROOT/$MARKER"
  gen_pki tessera-local-ca \
    DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local \
    "$NODE"
  kubeconfig_for "$STATE/admin.kubeconfig" admin
  kubeconfig_for "$STATE/scheduler.kubeconfig" system:kube-scheduler
  kubeconfig_for "$STATE/controller-manager.kubeconfig" system:kube-controller-manager
  kubeconfig_for "$STATE/kubelet/kubeconfig" "system:node:$NODE"
  write_containerd_config
  write_kubelet_config

  log "starting the registry on $REGISTRY"
  start registry "$BIN/crane" registry serve --address "$REGISTRY"

  start_etcd "$BIN" local
  local p=$STATE/pki
  # The API server sends webhooks a client certificate (CN kube-apiserver,
  # signed by $p/webhook-client-ca.crt, which install.sh gives the webhook):
  # to the chart's webhook by URL (overlay/values.yaml) and by Service.
  webhook_client_config "$p" "127.0.0.1:$WEBHOOK_PORT" tessera-webhook.tessera.svc
  start_apiserver "$BIN" --enable-admission-plugins NodeRestriction --allow-privileged \
    --admission-control-config-file "$p/admission.yaml" \
    --kubelet-client-certificate "$p/kubelet-client.crt" --kubelet-client-key "$p/kubelet-client.key" \
    --kubelet-preferred-address-types Hostname,InternalIP

  log "starting containerd"
  PATH="$STATE/bin:$BIN:$PATH" start containerd "$BIN/containerd" --config "$STATE/containerd/config.toml"
  wait_for containerd 60 test -S "$STATE/containerd/containerd.sock"
  wait_for "registry" 60 curl -fsS "http://$REGISTRY/v2/"
  images

  log "starting kube-controller-manager and kube-scheduler"
  start_controller_manager "$BIN" \
    --cluster-signing-cert-file "$p/ca.crt" --cluster-signing-key-file "$p/ca.key"
  start_scheduler "$BIN" --kubeconfig "$STATE/scheduler.kubeconfig" --leader-elect=false

  log "starting the kubelet (node $NODE, root dir $KUBELET_ROOT)"
  start kubelet "$BIN/kubelet" --config "$STATE/kubelet/config.yaml" \
    --kubeconfig "$STATE/kubelet/kubeconfig" --hostname-override "$NODE" \
    --root-dir "$KUBELET_ROOT" --cert-dir "$STATE/kubelet/pki"
  wait_for "node $NODE Ready" "$UP_TIMEOUT" node_ready
  # Pods wait for their service account ("default") before they can be created.
  wait_for "service account default/default" 60 \
    "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" get serviceaccount default -n default

  log "up in $((SECONDS - t0))s. export KUBECONFIG=$STATE/admin.kubeconfig PATH=$BIN:\$PATH"
}

# Unmounts everything at or below $1, deepest first.
unmount_under() {
  local root=$1 m
  awk -v r="$root" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
    done
}

cmd_down() {
  local t0=$SECONDS
  [ -d "$STATE" ] || { log "not up ($STATE does not exist)"; return 0; }
  BIN=""
  if [ -f "$STATE/pids/containerd" ]; then BIN=$(dirname "$(awk '{print $2}' "$STATE/pids/containerd")"); fi

  # The kubelet first, so it restarts nothing; then the containers, so no shim or
  # container process outlives containerd.
  stop kubelet 30
  if alive containerd >/dev/null && [ -x "$BIN/ctr" ]; then
    local ctr=("$BIN/ctr" --address "$STATE/containerd/containerd.sock" -n k8s.io) id
    for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
      "${ctr[@]}" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
      timeout 20 "${ctr[@]}" tasks delete -f "$id" >/dev/null 2>&1 || true
    done
  fi
  stop_in_reverse "${COMPONENTS[@]}"
  # Shims are started by our containerd with its socket address on their command
  # line; any left over are ours.
  local pid
  for pid in $(pgrep -f -- "-address $STATE/containerd/containerd.sock" || true); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "containerd-shim-runc-v2.*-address $STATE/containerd/containerd.sock"; then
      stop_pid "$pid" "containerd shim" 5
    fi
  done

  unmount_under "$KUBELET_ROOT"
  unmount_under "$STATE"
  ip link del "$BRIDGE" 2>/dev/null || true
  local d
  if [ -f "$STATE/owned" ]; then
    while read -r d; do
      case $d in "$KUBELET_ROOT" | "$POD_LOGS" | "$CDI_DIR") rm -rf "$d" ;; esac
    done <"$STATE/owned"
  fi
  # A kubelet root dir left by an earlier cluster.sh run is ours too.
  if [ -e "$KUBELET_ROOT/$MARKER" ]; then rm -rf "$KUBELET_ROOT"; fi
  rm -rf "$STATE"
  log "down in $((SECONDS - t0))s"
}

cmd_status() {
  local rc=0
  print_status "${COMPONENTS[@]}" || rc=1
  if [ "$rc" = 0 ]; then
    BIN=$(dirname "$(awk '{print $2}' "$STATE/pids/kubelet")")
    "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" get nodes -o wide || rc=1
  fi
  return "$rc"
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  kubeconfig)
    [ -f "$STATE/admin.kubeconfig" ] || die "not up (no $STATE/admin.kubeconfig)"
    echo "$STATE/admin.kubeconfig"
    ;;
  env)
    [ -f "$STATE/admin.kubeconfig" ] || die "not up (no $STATE/admin.kubeconfig)"
    tools
    echo "export KUBECONFIG=$STATE/admin.kubeconfig"
    echo "export PATH=$BIN:\$PATH"
    echo "export TESSERA_REGISTRY=$REGISTRY"
    ;;
  *)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
