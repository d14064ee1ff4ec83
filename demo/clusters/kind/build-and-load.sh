#!/usr/bin/env bash
# Builds the plugin image with Docker (deployments/container/Dockerfile) and loads
# it into the kind cluster's nodes.
#   KIND_CLUSTER_NAME [tessera]   TESSERA_IMAGE [ghcr.io/tessera-dev/tessera-kubelet-plugin:dev]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
name=${KIND_CLUSTER_NAME:-tessera}
image=${TESSERA_IMAGE:-ghcr.io/tessera-dev/tessera-kubelet-plugin:dev}

docker build --target kubelet-plugin -f "$repo/deployments/container/Dockerfile" -t "$image" "$repo"
kind load docker-image --name "$name" "$image"
echo "$image"
