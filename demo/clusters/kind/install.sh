#!/usr/bin/env bash
# Installs Tessera into the kind cluster: deployments/manifests with the image
# build-and-load.sh loaded, a mock GPU profile (kind nodes have no GPUs, so the
# plugin runs unprivileged without /dev or the driver root), and
# deployments/deviceclasses.yaml; waits for the DaemonSet and the ResourceSlices.
#   KIND_CLUSTER_NAME [tessera]   TESSERA_IMAGE [ghcr.io/tessera-dev/tessera-kubelet-plugin:dev]
#   TESSERA_MOCK_PROFILE [hgx-h100]   TESSERA_INSTALL_TIMEOUT [180]
#   install.sh uninstall   removes it again
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
name=${KIND_CLUSTER_NAME:-tessera}
image=${TESSERA_IMAGE:-ghcr.io/tessera-dev/tessera-kubelet-plugin:dev}
profile=${TESSERA_MOCK_PROFILE:-hgx-h100}
timeout=${TESSERA_INSTALL_TIMEOUT:-180}
kubectl=(kubectl --context "kind-$name")

# kustomize takes only relative paths to other kustomizations.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
manifests=$(realpath --relative-to="$work" "$repo/deployments/manifests")
cat >"$work/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $manifests
images:
- name: ghcr.io/tessera-dev/tessera-kubelet-plugin
  newName: ${image%:*}
  newTag: ${image##*:}
patches:
- target: {kind: DaemonSet, name: tessera-kubelet-plugin}
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --mock-profile=$profile
- path: mock.yaml
YAML
cat >"$work/mock.yaml" <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: tessera-kubelet-plugin
  namespace: tessera
spec:
  template:
    spec:
      containers:
      - name: plugin
        securityContext:
          privileged: false
        volumeMounts:
        - mountPath: /dev
          \$patch: delete
        - mountPath: /driver-root
          \$patch: delete
      volumes:
      - name: dev
        \$patch: delete
      - name: driver-root
        \$patch: delete
YAML

if [ "${1:-}" = uninstall ]; then
  "${kubectl[@]}" delete --ignore-not-found -f "$repo/deployments/deviceclasses.yaml"
  "${kubectl[@]}" delete --ignore-not-found -k "$work"
  exit 0
fi

"${kubectl[@]}" apply -k "$work"
"${kubectl[@]}" apply -f "$repo/deployments/deviceclasses.yaml"
"${kubectl[@]}" -n tessera rollout status daemonset/tessera-kubelet-plugin --timeout="${timeout}s"
for ((i = 0; i < timeout; i++)); do
  if [ -n "$("${kubectl[@]}" get resourceslices --field-selector spec.driver=gpu.tessera.dev -o name)" ]; then
    "${kubectl[@]}" get resourceslices --field-selector spec.driver=gpu.tessera.dev
    exit 0
  fi
  sleep 1
done
echo "install: no ResourceSlice of gpu.tessera.dev after ${timeout}s" >&2
exit 1
