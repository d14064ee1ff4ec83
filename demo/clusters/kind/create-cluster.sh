#!/usr/bin/env bash
# Creates the kind cluster (kind-config.yaml) and waits for its nodes to be Ready.
#   KIND_CLUSTER_NAME [tessera]   KIND_WAIT [180s]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=${KIND_CLUSTER_NAME:-tessera}

for t in docker kind kubectl; do
  command -v "$t" >/dev/null || { echo "create-cluster: missing '$t' (see https://kind.sigs.k8s.io/docs/user/quick-start/)" >&2; exit 1; }
done
if kind get clusters 2>/dev/null | grep -qx "$name"; then
  echo "create-cluster: kind cluster '$name' already exists" >&2
else
  kind create cluster --name "$name" --config "$here/kind-config.yaml" --wait "${KIND_WAIT:-180s}"
fi
kubectl --context "kind-$name" wait --for=condition=Ready node --all --timeout="${KIND_WAIT:-180s}"
