#!/usr/bin/env bash
# Installs Tessera into the kind cluster with the Helm chart
# (deployments/helm/tessera): the plugin image build-and-load.sh loaded, a mock
# GPU profile (kind nodes have no GPUs, so the chart runs the plugin
# unprivileged without /dev or the driver root), the webhook (its image built
# here with Docker and loaded, unless TESSERA_WEBHOOK_IMAGE names one already
# loaded), the DeviceClasses. Waits for the DaemonSet, the webhook and the
# ResourceSlices. kind has kube-proxy and DNS, so the chart's defaults apply:
# the API server calls the webhook through its Service.
#   KIND_CLUSTER_NAME [tessera]   TESSERA_IMAGE [ghcr.io/tessera-dev/tessera-kubelet-plugin:dev]
#   TESSERA_WEBHOOK_IMAGE [build ghcr.io/tessera-dev/tessera-webhook:dev]
#   TESSERA_MOCK_PROFILE [hgx-h100]   TESSERA_INSTALL_TIMEOUT [180]   HELM [helm]
#   install.sh uninstall   removes it again
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
name=${KIND_CLUSTER_NAME:-tessera}
image=${TESSERA_IMAGE:-ghcr.io/tessera-dev/tessera-kubelet-plugin:dev}
webhook_image=${TESSERA_WEBHOOK_IMAGE:-}
profile=${TESSERA_MOCK_PROFILE:-hgx-h100}
timeout=${TESSERA_INSTALL_TIMEOUT:-180}
helm=${HELM:-helm}
namespace=tessera
release=tessera
kubectl=(kubectl --context "kind-$name")

if [ "${1:-}" = uninstall ]; then
  "$helm" --kube-context "kind-$name" uninstall -n "$namespace" "$release" --wait --timeout "${timeout}s" || true
  "${kubectl[@]}" delete namespace "$namespace" --ignore-not-found
  exit 0
fi

if [ -z "$webhook_image" ]; then
  webhook_image=ghcr.io/tessera-dev/tessera-webhook:dev
  docker build --target webhook -f "$repo/deployments/container/Dockerfile" -t "$webhook_image" "$repo"
  kind load docker-image --name "$name" "$webhook_image"
fi

# Host paths need Pod Security level "privileged"; helm cannot label namespaces.
"${kubectl[@]}" create namespace "$namespace" --dry-run=client -o yaml |
  "${kubectl[@]}" label --local -f - pod-security.kubernetes.io/enforce=privileged -o yaml |
  "${kubectl[@]}" apply -f - >/dev/null

"$helm" --kube-context "kind-$name" upgrade --install "$release" "$repo/deployments/helm/tessera" \
  --namespace "$namespace" \
  --set "kubeletPlugin.image.repository=${image%:*}" --set-string "kubeletPlugin.image.tag=${image##*:}" \
  --set "webhook.image.repository=${webhook_image%:*}" --set-string "webhook.image.tag=${webhook_image##*:}" \
  --set "kubeletPlugin.mockProfile=$profile" \
  --wait --timeout "${timeout}s"

for ((i = 0; i < timeout; i++)); do
  if [ -n "$("${kubectl[@]}" get resourceslices --field-selector spec.driver=gpu.tessera.dev -o name)" ]; then
    "${kubectl[@]}" get resourceslices --field-selector spec.driver=gpu.tessera.dev
    exit 0
  fi
  sleep 1
done
echo "install: no ResourceSlice of gpu.tessera.dev after ${timeout}s" >&2
exit 1
