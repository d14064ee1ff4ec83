#!/usr/bin/env bash
# Installs Tessera on the local cluster (cluster.sh up first) with the Helm chart:
#   1. builds cmd/tessera-kubelet-plugin and cmd/tessera-webhook,
#   2. builds their images (the binary, plus the loader and libc that ldd lists
#      for the cgo plugin; no base image) and pushes them to the cluster's
#      registry, tagged by content,
#   3. `helm upgrade --install tessera deployments/helm/tessera` into namespace
#      tessera with overlay/values.yaml (host network for the plugin and the
#      webhook, the webhook called by URL on 127.0.0.1: no kube-proxy here), the
#      mock profile, the images and the ports,
#   4. waits for the DaemonSet, the webhook (until it refuses a bad GpuConfig in
#      a server-side dry run) and the node's ResourceSlices.
#
#   install.sh            install or upgrade (a changed binary rolls the pods)
#   install.sh uninstall  helm uninstall, then delete the namespace
#
# Environment: TESSERA_MOCK_PROFILE [hgx-h100], TESSERA_INSTALL_TIMEOUT [180],
# TESSERA_PLUGIN_BINARY (a prebuilt plugin binary instead of building cmd/),
# TESSERA_WEBHOOK_PORT [9443] (on 127.0.0.1), TESSERA_HELM_ARGS (more helm
# arguments, word-split), and cluster.sh's TESSERA_STATE_DIR,
# TESSERA_REGISTRY_PORT, TESSERA_APISERVER_PORT.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
STATE=${TESSERA_STATE_DIR:-/tmp/tessera-local}
APISERVER_PORT=${TESSERA_APISERVER_PORT:-6443}
WEBHOOK_PORT=${TESSERA_WEBHOOK_PORT:-9443}
PROFILE=${TESSERA_MOCK_PROFILE:-hgx-h100}
TIMEOUT=${TESSERA_INSTALL_TIMEOUT:-180}
DRIVER=gpu.tessera.dev
NAMESPACE=tessera
RELEASE=tessera
CHART=$repo/deployments/helm/tessera

log() { echo "install: $*" >&2; }
die() { echo "install: error: $*" >&2; exit 1; }

env_lines=$("$here/cluster.sh" env) || die "the local cluster is not up (run $here/cluster.sh up)"
eval "$env_lines"
"$here/cluster.sh" status >/dev/null || die "the local cluster is not fully up ($here/cluster.sh status)"

# helm comes from the tools cache; a cluster started before helm was added to
# build-tools.sh has none yet (building only helm takes about a minute).
bin=$("$here/build-tools.sh" | tail -n1)
helm=$bin/helm
[ -x "$helm" ] || die "build-tools.sh did not produce $helm"

work=$STATE/install
mkdir -p "$work"

if [ "${1:-}" = uninstall ]; then
  if "$helm" status -n "$NAMESPACE" "$RELEASE" >/dev/null 2>&1; then
    "$helm" uninstall -n "$NAMESPACE" "$RELEASE" --wait --timeout "${TIMEOUT}s"
  fi
  kubectl delete namespace "$NAMESPACE" --ignore-not-found --wait --timeout="${TIMEOUT}s"
  exit 0
fi

if [ -n "${TESSERA_PLUGIN_BINARY:-}" ]; then
  log "using $TESSERA_PLUGIN_BINARY"
  cp "$TESSERA_PLUGIN_BINARY" "$work/tessera-kubelet-plugin"
else
  [ -d "$repo/cmd/tessera-kubelet-plugin" ] || die "no $repo/cmd/tessera-kubelet-plugin to build"
  log "building tessera-kubelet-plugin"
  # cgo stays on: go-nvml dlopens libnvidia-ml on real nodes.
  (cd "$repo" && go build -trimpath -o "$work/tessera-kubelet-plugin" ./cmd/tessera-kubelet-plugin)
fi
log "building tessera-webhook"
# Static: the image holds nothing but the binary.
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$work/tessera-webhook" ./cmd/tessera-webhook)
(cd "$repo" && go build -trimpath -o "$work/imagebuild" ./demo/clusters/local/imagebuild)

plugin_tag=$(sha256sum "$work/tessera-kubelet-plugin" | cut -c1-12)
plugin_repo=$TESSERA_REGISTRY/tessera/tessera-kubelet-plugin
log "pushing $plugin_repo:$plugin_tag"
"$work/imagebuild" --ref "$plugin_repo:$plugin_tag" --with-libs \
  --file "$work/tessera-kubelet-plugin:/usr/bin/tessera-kubelet-plugin" \
  --entrypoint /usr/bin/tessera-kubelet-plugin >&2

webhook_tag=$(sha256sum "$work/tessera-webhook" | cut -c1-12)
webhook_repo=$TESSERA_REGISTRY/tessera/tessera-webhook
log "pushing $webhook_repo:$webhook_tag"
"$work/imagebuild" --ref "$webhook_repo:$webhook_tag" \
  --file "$work/tessera-webhook:/usr/bin/tessera-webhook" \
  --entrypoint /usr/bin/tessera-webhook >&2

# The chart mounts host paths and uses the host network: Pod Security level
# "privileged" (helm's --create-namespace cannot label).
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml |
  kubectl label --local -f - pod-security.kubernetes.io/enforce=privileged -o yaml |
  kubectl apply -f - >/dev/null

# Objects an older install.sh applied with kustomize: helm adopts those with
# the same name and the old policy (another name) goes.
for obj in deviceclass/gpu.tessera.dev deviceclass/shared.gpu.tessera.dev \
           clusterrole/tessera-kubelet-plugin clusterrolebinding/tessera-kubelet-plugin \
           "-n $NAMESPACE serviceaccount/tessera-kubelet-plugin" "-n $NAMESPACE daemonset/tessera-kubelet-plugin"; do
  # shellcheck disable=SC2086 # $obj is "[-n ns] kind/name" on purpose
  managed=$(kubectl get $obj --ignore-not-found -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')
  # shellcheck disable=SC2086
  if [ -n "$(kubectl get $obj --ignore-not-found -o name)" ] && [ "$managed" != Helm ]; then
    log "adopting $obj into the helm release"
    # shellcheck disable=SC2086
    kubectl annotate --overwrite $obj meta.helm.sh/release-name="$RELEASE" meta.helm.sh/release-namespace="$NAMESPACE" >/dev/null
    # shellcheck disable=SC2086
    kubectl label --overwrite $obj app.kubernetes.io/managed-by=Helm >/dev/null
  fi
done
kubectl delete --ignore-not-found validatingadmissionpolicybinding/tessera-resourceslices \
  validatingadmissionpolicy/tessera-resourceslices >/dev/null

# The API server's webhook client certificate (cluster.sh up): the webhook
# verifies it and refuses reviews without it (webhook.clientAuth).
client_ca=$STATE/pki/webhook-client-ca.crt
[ -s "$client_ca" ] || die "no $client_ca: the cluster was started by an older cluster.sh, restart it (cluster.sh down; cluster.sh up)"

log "helm upgrade --install $RELEASE (mock profile $PROFILE)"
# shellcheck disable=SC2086 # TESSERA_HELM_ARGS is word-split on purpose
"$helm" upgrade --install "$RELEASE" "$CHART" --namespace "$NAMESPACE" \
  -f "$here/overlay/values.yaml" \
  --set "kubeletPlugin.image.repository=$plugin_repo" --set-string "kubeletPlugin.image.tag=$plugin_tag" \
  --set "webhook.image.repository=$webhook_repo" --set-string "webhook.image.tag=$webhook_tag" \
  --set "kubeletPlugin.mockProfile=$PROFILE" \
  --set-string "kubeletPlugin.apiServer.port=$APISERVER_PORT" \
  --set "webhook.port=$WEBHOOK_PORT" --set "webhook.url=https://127.0.0.1:$WEBHOOK_PORT" \
  --set webhook.clientAuth.enabled=true --set-file "webhook.clientAuth.caBundle=$client_ca" \
  ${TESSERA_HELM_ARGS:-} >&2

diagnose() {
  kubectl -n "$NAMESPACE" get pods -o wide >&2 || true
  kubectl -n "$NAMESPACE" logs "$1" --tail=30 >&2 || true
}

log "waiting for the DaemonSet and the webhook (up to ${TIMEOUT}s each)"
kubectl -n "$NAMESPACE" rollout status daemonset/tessera-kubelet-plugin --timeout="${TIMEOUT}s" ||
  { diagnose daemonset/tessera-kubelet-plugin; die "the DaemonSet did not become ready"; }
kubectl -n "$NAMESPACE" rollout status deployment/tessera-webhook --timeout="${TIMEOUT}s" ||
  { diagnose deployment/tessera-webhook; die "the webhook did not become ready"; }

# Ready is not reachable: wait until the API server gets the webhook's answer
# for a claim with a bad GpuConfig, in a server-side dry run. Only the webhook
# reads opaque parameters, so the field in the answer proves the path works.
cat >"$work/bad-claim.yaml" <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: install-check, namespace: $NAMESPACE}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: shared.gpu.tessera.dev}
    config:
    - opaque:
        driver: $DRIVER
        parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, sharing: {isolaton: MPS}}
EOF
for ((i = 0; i < TIMEOUT; i++)); do
  if out=$(kubectl create --dry-run=server -f "$work/bad-claim.yaml" 2>&1); then
    die "the webhook admitted a bad GpuConfig: $out"
  fi
  case $out in *"sharing.isolaton: unknown field"*) break ;; esac
  sleep 1
done
case $out in
  *"sharing.isolaton: unknown field"*) log "the webhook refuses a bad GpuConfig: $out" ;;
  *) diagnose deployment/tessera-webhook; die "the API server cannot reach the webhook: $out" ;;
esac

log "waiting for ResourceSlices of $DRIVER"
for ((i = 0; i < TIMEOUT; i++)); do
  n=$(kubectl get resourceslices --field-selector "spec.driver=$DRIVER" -o name 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] && break
  sleep 1
done
[ "$n" -gt 0 ] || {
  diagnose daemonset/tessera-kubelet-plugin
  die "no ResourceSlice of $DRIVER after ${TIMEOUT}s"
}
kubectl get resourceslices --field-selector "spec.driver=$DRIVER"
log "installed $plugin_repo:$plugin_tag and $webhook_repo:$webhook_tag"
