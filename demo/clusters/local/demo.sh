#!/usr/bin/env bash
# Runs demo specs on the local cluster (cluster.sh up && install.sh first) and
# prints what each pod's container saw.
#   demo.sh [SPEC...]   default: demo/specs/10-quarter-gpu-shares.yaml
#   demo.sh clean       delete the tessera-demo namespace (and so the demo's claims)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
eval "$("$here/cluster.sh" env)"

if [ "${1:-}" = clean ]; then
  kubectl delete namespace tessera-demo --ignore-not-found --timeout=120s
  exit 0
fi
[ $# -gt 0 ] || set -- "$repo/demo/specs/10-quarter-gpu-shares.yaml"
kubectl apply -f "$repo/demo/specs/00-namespace.yaml"
for spec in "$@"; do kubectl apply -f "$spec"; done
kubectl -n tessera-demo wait pod --all --for=condition=Ready --timeout=120s
kubectl -n tessera-demo get resourceclaims \
  -o custom-columns='CLAIM:.metadata.name,DEVICE:.status.allocation.devices.results[*].device,CAPACITY:.status.allocation.devices.results[*].consumedCapacity'
for pod in $(kubectl -n tessera-demo get pods -o name); do
  echo "--- $pod"
  kubectl -n tessera-demo logs "$pod" | sed '/^tessera-env-done$/q'
done
