#!/usr/bin/env bash
# A large simulated cluster for the scale benchmark (docs/scale.md): the local
# cluster's real etcd, kube-apiserver, kube-controller-manager and kube-scheduler
# (the binaries demo/clusters/local/build-tools.sh builds, on the local cluster's
# ports) plus kwok, which keeps fake nodes Ready and turns pods bound to them
# Running. There is no kubelet and no container runtime: no node of this cluster
# runs anything. Fake nodes, each with the ResourceSlices Tessera's kubelet plugin
# publishes for a mock profile, are made by "tessera-bench scale -ensure-nodes N".
#
#   cluster.sh up [NODES]  take the machine's cluster lock, start the control plane
#                          and kwok, install Tessera's DeviceClasses and make NODES
#                          fake nodes (default 0); the lock is held until `down`
#   cluster.sh down        stop what `up` started (pids in the state dir), delete the
#                          state dir, release the lock
#   cluster.sh status      which components run, and the node count
#   cluster.sh bench ARGS  run the benchmark ("tessera-bench scale") on it, e.g.
#                          `cluster.sh bench -nodes 100,500,1000 -out results`
#   cluster.sh env         print `export KUBECONFIG=...` for the admin kubeconfig
#
# Environment (defaults in brackets):
#   TESSERA_SCALE_STATE_DIR   everything this cluster writes [/tmp/tessera-scale]
#   TESSERA_CACHE_DIR         built binaries [~/.cache/tessera]
#   TESSERA_APISERVER_PORT    kube-apiserver on 127.0.0.1 [6443]
#   TESSERA_ETCD_PORT         etcd client port; peer port is +1 [2379]
#   TESSERA_SCALE_QPS         client QPS and burst of kube-scheduler and
#                             kube-controller-manager [5000, as scheduler_perf;
#                             "default" keeps the components' own 50/100 and 20/30]
#   TESSERA_SCALE_PROFILE     mock node profile of the fake nodes [hgx-h100]
#   TESSERA_CLUSTER_LOCK      the machine's cluster lock [/tmp/tessera-cluster.lock]
#   TESSERA_CLUSTER_LOCK_HELD=1  the caller holds the lock already (make bench-scale)
#   TESSERA_UP_TIMEOUT        seconds to wait for each component [180]
set -euo pipefail

here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
repo=$(cd "$here/../.." && pwd)
[ -r "$repo/hack/lib/cluster.sh" ] || { echo "$0: $repo/hack/lib/cluster.sh is missing: run this script from a Tessera checkout" >&2; exit 1; }
# shellcheck source=SCRIPTDIR/../lib/cluster.sh
. "$repo/hack/lib/cluster.sh"
CLUSTER_LOG_PREFIX=scale-cluster
CLUSTER_NAME=tessera-scale

STATE=${TESSERA_SCALE_STATE_DIR:-/tmp/tessera-scale}
APISERVER_PORT=${TESSERA_APISERVER_PORT:-6443}
ETCD_PORT=${TESSERA_ETCD_PORT:-2379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
QPS=${TESSERA_SCALE_QPS:-5000}
PROFILE=${TESSERA_SCALE_PROFILE:-hgx-h100}
LOCK=${TESSERA_CLUSTER_LOCK:-/tmp/tessera-cluster.lock}
UP_TIMEOUT=${TESSERA_UP_TIMEOUT:-180}
SERVICE_CIDR=10.0.0.0/24
# kwok renews each node's lease every quarter of this; long leases keep 1000 fake
# nodes from costing the API server ~100 writes/s. The node lifecycle controller's
# grace period is longer, so no fake node turns NotReady.
LEASE_SECONDS=600
NODE_GRACE=1200s
# Start order; `down` stops in reverse. lock is the process holding the lock.
COMPONENTS=(lock etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

# STARTED (hack/lib/cluster.sh): the components this invocation started, in
# order; a failed `up` stops only these (the state dir may hold another
# invocation's cluster).
LOCK_WAITER=
stop_started() {
  # A start aborted while waiting for the lock: its waiter must not take it.
  if [ -n "$LOCK_WAITER" ]; then kill "$LOCK_WAITER" 2>/dev/null || true; fi
  stop_in_reverse ${STARTED[@]+"${STARTED[@]}"}
}

# take_lock: a child process holds the lock (flock on its inherited fd) until
# `down` stops it; -o is not needed because nothing else inherits the fd.
take_lock() {
  if [ "${TESSERA_CLUSTER_LOCK_HELD:-}" = 1 ]; then
    log "the caller holds $LOCK"
    return 0
  fi
  log "waiting for the cluster lock $LOCK (up to 1 h)"
  local ready="$STATE/lock.ready.$$"
  rm -f "$ready"
  # shellcheck disable=SC2016 # $1 and $2 are the inner shell's arguments
  # The subshell takes the lock on fd 9, says so, and becomes sleep, which keeps fd 9.
  setsid bash -c 'exec 9>>"$1" && flock -w 3600 9 && : >"$2" && exec sleep infinity' \
    _ "$LOCK" "$ready" >"$STATE/logs/lock.log" 2>&1 </dev/null &
  local pid=$!
  LOCK_WAITER=$pid
  local i
  for ((i = 0; i < 3600 * 5; i++)); do
    [ -e "$ready" ] && break
    [ -d "/proc/$pid" ] || die "could not take $LOCK"
    sleep 0.2
  done
  [ -e "$ready" ] || die "timed out waiting for $LOCK"
  # The holder is ours once it has become sleep.
  for ((i = 0; i < 50; i++)); do
    [ "$(basename "$(readlink "/proc/$pid/exe")")" = sleep ] && break
    sleep 0.1
  done
  echo "$pid $(readlink -f "/proc/$pid/exe")" >"$(pidfile lock)"
  STARTED+=(lock)
  LOCK_WAITER=
  rm -f "$ready"
  log "holding $LOCK (pid $pid)"
}

# client_qps_args: kube-controller-manager's client QPS flags.
kcm_qps_args() {
  [ "$QPS" = default ] || echo "--kube-api-qps=$QPS --kube-api-burst=$QPS"
}

write_scheduler_config() {
  local conn=""
  [ "$QPS" = default ] || conn="  qps: $QPS
  burst: $QPS"
  cat >"$STATE/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $STATE/scheduler.kubeconfig
$conn
leaderElection:
  leaderElect: false
EOF
}

# bench ARGS: "tessera-bench scale ARGS", tessera-bench built from this checkout into the state dir.
bench() {
  mkdir -p "$STATE/bin"
  (cd "$repo" && go build -o "$STATE/bin/tessera-bench" ./cmd/tessera-bench) >&2
  "$STATE/bin/tessera-bench" scale "$@"
}

cmd_up() {
  local nodes=${1:-0} t0=$SECONDS
  [[ $nodes =~ ^[0-9]+$ ]] || die "NODES must be a number, not '$nodes'"
  for t in go openssl flock setsid curl; do
    command -v "$t" >/dev/null || die "missing '$t'"
  done
  mkdir -p "$STATE"/{pids,logs,etcd}
  if alive kube-apiserver >/dev/null && alive kwok >/dev/null; then
    log "already up ($STATE)"
  else
    # A failed start stops whatever it started, the lock holder included.
    trap 'rc=$?; if [ "$rc" != 0 ]; then log "up failed: stopping what it started"; stop_started; fi' EXIT
    take_lock
    # The lock keeps other users of the local cluster out; a port in use now means
    # a cluster started without it.
    local port
    for port in "$APISERVER_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT" 10257 10259; do
      alive etcd >/dev/null || port_free "$port" ||
        die "127.0.0.1:$port is in use (is the local cluster up without the lock? demo/clusters/local/cluster.sh down)"
    done
    local bin kwok
    bin=$("$repo/demo/clusters/local/build-tools.sh" | tail -n1)
    kwok=$("$here/build-kwok.sh" | tail -n1)
    echo "$bin" >"$STATE/bindir"
    gen_pki tessera-scale-ca DNS:localhost,DNS:kubernetes
    kubeconfig_for "$STATE/admin.kubeconfig" admin
    kubeconfig_for "$STATE/scheduler.kubeconfig" system:kube-scheduler
    kubeconfig_for "$STATE/controller-manager.kubeconfig" system:kube-controller-manager
    write_scheduler_config
    (cd "$here/tools" && go run ./kwok-stages) >"$STATE/kwok-stages.yaml"

    start_etcd "$bin" scale --quota-backend-bytes 8589934592
    start_apiserver "$bin"

    log "starting kube-controller-manager, kube-scheduler (client QPS/burst: $QPS) and kwok"
    # shellcheck disable=SC2046 # kcm_qps_args is zero or two words
    start_controller_manager "$bin" --node-monitor-grace-period "$NODE_GRACE" $(kcm_qps_args)
    start_scheduler "$bin" --config "$STATE/scheduler.yaml"
    start kwok "$kwok" --kubeconfig "$STATE/admin.kubeconfig" --config "$STATE/kwok-stages.yaml" \
      --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
      --node-lease-duration-seconds "$LEASE_SECONDS" --server-address 127.0.0.1:10247
    wait_for "service account default/default" 60 \
      "$bin/kubectl" --kubeconfig "$STATE/admin.kubeconfig" get serviceaccount default -n default
    {
      echo "kubernetes=$("$bin/kube-apiserver" --version | awk '{print $2}')"
      echo "kwok=$(awk '/^require sigs.k8s.io\/kwok/ {print $3}' "$here/tools/go.mod")"
      echo "scheduler_qps=$QPS"
      echo "controller_manager_qps=$QPS"
      echo "profile=$PROFILE"
    } >"$STATE/cluster.env"
  fi
  bench -kubeconfig "$STATE/admin.kubeconfig" -profile "$PROFILE" -ensure-nodes "$nodes"
  trap - EXIT
  log "up in $((SECONDS - t0))s: $nodes fake nodes. export KUBECONFIG=$STATE/admin.kubeconfig"
}

cmd_down() {
  [ -d "$STATE" ] || { log "not up ($STATE does not exist)"; return 0; }
  stop_in_reverse "${COMPONENTS[@]}"
  rm -rf "$STATE"
  log "down"
}

cmd_status() {
  local rc=0
  print_status "${COMPONENTS[@]}" || rc=1
  if alive kube-apiserver >/dev/null; then
    echo "nodes: $("$(cat "$STATE/bindir")/kubectl" --kubeconfig "$STATE/admin.kubeconfig" get nodes --no-headers | wc -l)"
  fi
  return "$rc"
}

case ${1:-} in
  up) cmd_up "${2:-0}" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  bench)
    shift
    alive kube-apiserver >/dev/null || die "not up (hack/scale/cluster.sh up first)"
    cpu=""
    for n in etcd kube-apiserver kube-controller-manager kube-scheduler kwok; do
      if pid=$(alive "$n"); then cpu+="${cpu:+,}$n=$pid"; fi
    done
    bench -kubeconfig "$STATE/admin.kubeconfig" -profile "$PROFILE" -cluster-env "$STATE/cluster.env" -cpu "$cpu" "$@"
    ;;
  env)
    [ -f "$STATE/admin.kubeconfig" ] || die "not up (no $STATE/admin.kubeconfig)"
    echo "export KUBECONFIG=$STATE/admin.kubeconfig"
    echo "export PATH=$(cat "$STATE/bindir"):\$PATH"
    ;;
  *)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
