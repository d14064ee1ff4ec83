#!/usr/bin/env bash
# Runs the demo specs on the local cluster (cluster.sh up && install.sh first)
# and prints a table of what each pod got: node, devices (from its claims'
# allocation), the GPU UUIDs and limits its container saw (from its log, where
# the demo containers print their env: TESSERA_GPU_<minor>=<uuid> per GPU and,
# for a share, TESSERA_GPU_<minor>_MEMORY_LIMIT and _CORES_LIMIT), and the
# isolation behind them.
#   demo.sh [SPEC...]   apply SPECs (default: every demo/specs/[1-9]*.yaml) into
#                       namespace tessera-demo, wait for the pods, print the table
#   demo.sh table       print the table for the pods already there
#   demo.sh clean       delete the tessera-demo namespace (and so the demo's claims)
# Environment: TESSERA_DEMO_TIMEOUT [120] seconds to wait for the pods.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
eval "$("$here/cluster.sh" env)"
NS=tessera-demo
TIMEOUT=${TESSERA_DEMO_TIMEOUT:-120}
MARKER=tessera-env-done

# pods: one line per pod: name, node, phase, ready, waiting reason (or -), and
# its claims (direct, generated from a template, or made by the scheduler for
# an extended resource), space-separated.
pods() {
  # shellcheck disable=SC2016 # a Go template, not shell
  kubectl -n "$NS" get pods -o go-template='{{range .items}}{{.metadata.name}}{{"\t"}}{{or .spec.nodeName "-"}}{{"\t"}}{{.status.phase}}{{"\t"}}
{{- $ready := "false"}}{{range .status.conditions}}{{if eq .type "Ready"}}{{$ready = .status}}{{end}}{{end}}{{$ready}}{{"\t"}}
{{- $why := "-"}}{{range .status.containerStatuses}}{{with .state.waiting}}{{$why = .reason}}{{end}}{{end}}{{$why}}{{"\t"}}
{{- range .spec.resourceClaims}}{{with .resourceClaimName}}{{.}} {{end}}{{end}}
{{- range .status.resourceClaimStatuses}}{{with .resourceClaimName}}{{.}} {{end}}{{end}}
{{- with .status.extendedResourceClaimStatus}}{{.resourceClaimName}}{{end}}{{"\n"}}{{end}}'
}

# claims: one line per claim: name, then its allocated devices (gpu-3 or
# gpu-0-shared), comma-separated.
claims() {
  # shellcheck disable=SC2016 # a Go template, not shell
  kubectl -n "$NS" get resourceclaims -o go-template='{{range .items}}{{.metadata.name}}{{"\t"}}
{{- with .status.allocation}}{{range $i, $r := .devices.results}}{{if $i}},{{end}}{{$r.device}}{{end}}{{else}}unallocated{{end}}{{"\n"}}{{end}}'
}

# gib BYTES: "19Gi", "15.5Gi".
gib() { awk -v b="$1" 'BEGIN { printf "%gGi", b / 1073741824 }'; }

table() {
  local -A devices=()
  local claim devs
  while IFS=$'\t' read -r claim devs; do
    devices[$claim]=$devs
  done < <(claims)

  local rows=() bad=0
  local pod node phase ready why claimlist
  while IFS=$'\t' read -r pod node phase ready why claimlist; do
    local devlist="" c
    for c in $claimlist; do
      devlist+="${devlist:+,}${devices[$c]:-unallocated}"
    done
    local uuids="-" mem="-" cores="-" iso="-"
    if [ "$ready" = True ]; then
      local log
      log=$(kubectl -n "$NS" logs "$pod" 2>/dev/null | sed "/^$MARKER\$/q") || log=""
      # One TESSERA_GPU_<minor>=<uuid> per GPU the container sees and, for a
      # share, TESSERA_GPU_<minor>_MEMORY_LIMIT and _CORES_LIMIT; listed in
      # minor order, one entry per GPU in each column ("whole" for a whole
      # GPU; just "whole" when all are).
      local minor uuid memlimit corelimit shares=0 wholes=0 mps hami tf
      uuids="" mem="" cores=""
      while read -r minor uuid; do
        [ -n "$minor" ] || continue
        memlimit=$(sed -n "s/^TESSERA_GPU_${minor}_MEMORY_LIMIT=//p" <<<"$log")
        corelimit=$(sed -n "s/^TESSERA_GPU_${minor}_CORES_LIMIT=//p" <<<"$log")
        uuids+="${uuids:+,}$uuid"
        if [ -n "$memlimit" ]; then
          mem+="${mem:+,}$(gib "$memlimit")"
          cores+="${cores:+,}$corelimit%"
          shares=$((shares + 1))
        else
          mem+="${mem:+,}whole"
          cores+="${cores:+,}whole"
          wholes=$((wholes + 1))
        fi
      done < <(sed -n 's/^TESSERA_GPU_\([0-9][0-9]*\)=/\1 /p' <<<"$log" | sort -n)
      mps=$(sed -n 's/^CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=//p' <<<"$log")
      hami=$(sed -n 's/^CUDA_DEVICE_SM_LIMIT=//p' <<<"$log")
      tf=$(sed -n 's/^TF_FORCE_GPU_ALLOW_GROWTH=//p' <<<"$log")
      if [ "$shares" -gt 0 ]; then
        if [ -n "$mps" ]; then
          iso="MPS (threads $mps%)"
        elif [ -n "$hami" ]; then
          iso="HAMiCore (SM $hami%)"
        elif [ "$tf" = true ]; then
          iso=Advisory
        else
          iso=unknown
        fi
        if [ "$wholes" -gt 0 ]; then iso="exclusive+$iso"; fi
      elif [ "$wholes" -gt 0 ]; then
        mem=whole cores=whole iso=exclusive
      else
        uuids=none mem=- cores=-
      fi
    else
      uuids="($phase${why:+, $why})"
      [ "$why" = - ] && uuids="($phase)"
      bad=$((bad + 1))
    fi
    rows+=("$pod"$'\t'"$node"$'\t'"${devlist:--}"$'\t'"$uuids"$'\t'"$mem"$'\t'"$cores"$'\t'"$iso")
  done < <(pods)

  {
    printf 'POD\tNODE\tDEVICE(S)\tGPU UUID(S)\tMEMORY LIMIT\tCORES LIMIT\tISOLATION\n'
    if [ ${#rows[@]} -gt 0 ]; then printf '%s\n' "${rows[@]}"; fi
  } | column -t -s $'\t'
  return "$bad"
}

# wait_pods: until every pod is Ready, or every one that is not has a
# container stuck (a waiting reason other than ContainerCreating), or TIMEOUT.
wait_pods() {
  local i pod node phase ready why rest pending stuck
  for ((i = 0; i < TIMEOUT; i++)); do
    pending=0 stuck=0
    while IFS=$'\t' read -r pod node phase ready why rest; do
      [ "$ready" = True ] && continue
      pending=$((pending + 1))
      case $why in -|ContainerCreating|PodInitializing) ;; *) stuck=$((stuck + 1)) ;; esac
    done < <(pods)
    [ "$pending" -eq 0 ] && return 0
    # A stuck container is given 20 s to recover before we stop waiting.
    [ "$pending" -eq "$stuck" ] && [ "$i" -ge 20 ] && return 1
    sleep 1
  done
  return 1
}

case "${1:-}" in
  clean)
    kubectl delete namespace "$NS" --ignore-not-found --timeout=120s
    exit 0
    ;;
  table)
    table
    exit
    ;;
esac

if [ $# -eq 0 ]; then
  set -- "$repo"/demo/specs/[1-9]*.yaml
fi
kubectl apply -f "$repo/demo/specs/00-namespace.yaml"
for spec in "$@"; do kubectl apply -f "$spec"; done
echo "waiting up to ${TIMEOUT}s for the pods in namespace $NS" >&2
wait_pods || true
echo
if ! table; then
  echo >&2
  echo "demo: some pods are not running; kubectl -n $NS describe pod <name> says why" >&2
  exit 1
fi
