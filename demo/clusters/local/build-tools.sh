#!/usr/bin/env bash
# Builds the pinned binaries the local cluster needs into a cache dir outside the
# clone, so a second run (or a second clone) reuses them. Every version is pinned;
# everything comes from the Go module proxy or Debian's packages.
#
#   TESSERA_CACHE_DIR   where binaries go (default: ~/.cache/tessera)
#
# Prints the bin dir on the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}

KUBERNETES_VERSION=v1.37.0
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.3.3
CRANE_VERSION=v0.22.1
# Not part of the bin dir's key (adding it would rebuild Kubernetes); a helm whose
# version differs from the pin is rebuilt in place instead.
HELM_VERSION=v3.22.0

# A plain `go build` reports v0.0.0-master; tools (kubectl, helm's kubeVersion checks)
# read the server's and the node's version, so stamp the real one.
k8s_version_pkg=k8s.io/component-base/version
K8S_LDFLAGS="-X $k8s_version_pkg.gitVersion=$KUBERNETES_VERSION -X $k8s_version_pkg.gitTreeState=clean"
K8S_LDFLAGS+=" -X $k8s_version_pkg.gitMajor=$(echo "$KUBERNETES_VERSION" | cut -d. -f1 | tr -d v)"
K8S_LDFLAGS+=" -X $k8s_version_pkg.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
K8S_LDFLAGS+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"

# The bin dir is keyed by the tools module and the pins above, so bumping a pin
# rebuilds; editing the rest of this script (comments, logging) does not.
key=$( (cat "$here/tools/go.mod" "$here/tools/go.sum"
        echo "$KUBERNETES_VERSION $CONTAINERD_VERSION $RUNC_VERSION $CRANE_VERSION $K8S_LDFLAGS") |
      sha256sum | cut -c1-12)
bin="$cache/bin-$key"
mkdir -p "$bin" "$cache/src"

log() { echo "build-tools: $*" >&2; }

need_debs=()
for pair in /usr/lib/cni/bridge:containernetworking-plugins /bin/busybox:busybox-static \
            /usr/include/seccomp.h:libseccomp-dev; do
  [ -e "${pair%%:*}" ] || need_debs+=("${pair#*:}")
done
if [ ${#need_debs[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages: ${need_debs[*]} (run: sudo apt-get install -y ${need_debs[*]})" >&2
    exit 1
  fi
  log "installing Debian packages: ${need_debs[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_debs[@]}" >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_debs[@]}" >&2; }
fi

# Kubernetes and etcd: built inside the tools module (never the project's go.mod).
for t in kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl; do
  if [ ! -x "$bin/$t" ]; then
    log "building $t $KUBERNETES_VERSION"
    (cd "$here/tools" && go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$bin/$t.tmp" "k8s.io/kubernetes/cmd/$t") >&2
    mv "$bin/$t.tmp" "$bin/$t"
  fi
done
if [ ! -x "$bin/etcd" ]; then
  log "building etcd"
  (cd "$here/tools" && go build -trimpath -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3) >&2
  mv "$bin/etcd.tmp" "$bin/etcd"
fi

# containerd, its shim and ctr.
for t in containerd containerd-shim-runc-v2 ctr; do
  if [ ! -x "$bin/$t" ]; then
    log "building $t $CONTAINERD_VERSION"
    GOBIN="$bin" go install "github.com/containerd/containerd/v2/cmd/$t@$CONTAINERD_VERSION" >&2
  fi
done

# runc: its module carries replace directives, so build from the module source with
# them dropped. Debian's runc is too old for containerd 2.4.
if [ ! -x "$bin/runc.real" ]; then
  log "building runc $RUNC_VERSION"
  src=$(GOFLAGS=-mod=mod go mod download -json "github.com/opencontainers/runc@$RUNC_VERSION" |
        sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  work="$cache/src/runc-$RUNC_VERSION"
  rm -rf "$work" && cp -r "$src" "$work" && chmod -R u+w "$work"
  sed -i '/^replace /d' "$work/go.mod"
  (cd "$work" && CGO_ENABLED=1 go build -trimpath -mod=mod -tags seccomp -o "$bin/runc.real" .) >&2
fi

if [ ! -x "$bin/crane" ]; then
  log "building crane $CRANE_VERSION"
  GOBIN="$bin" go install "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION" >&2
fi

# helm: the chart's install path (install.sh) and its lint/golden tests.
if [ "$("$bin/helm" version --template '{{.Version}}' 2>/dev/null)" != "$HELM_VERSION" ]; then
  log "building helm $HELM_VERSION"
  # `go install` leaves helm's version at "v3.22"; stamp the full one, which the
  # check above and `helm version` read.
  GOBIN="$bin" go install -ldflags "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
fi

echo "$bin"
