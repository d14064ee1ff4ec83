#!/usr/bin/env bash
# make gpu-check-bundle: the real-GPU check as one folder to copy to a GPU
# machine that has the NVIDIA driver (and maybe the CUDA toolkit) but no Go,
# no Kubernetes and no network (docs/gpu-check.md, "The bundle").
#
#   hack/gpu-check-bundle.sh [OUT]     default OUT: _output/gpu-check-bundle
#
# The folder holds run.sh (hack/gpu-check-run.sh), the probe built here
# (stripped, xz-compressed), the PTX kernel, a static runc (xz-compressed) and
# a tiny root filesystem: Debian's static busybox, which also decompresses the
# other two, so the GPU machine needs neither xz nor gzip. It fails when the
# folder exceeds 30 MiB.
#
#   TESSERA_CACHE_DIR   where the static runc is cached (default ~/.cache/tessera)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$repo/_output/gpu-check-bundle}
cache=${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
GO=${GO:-go}
# The same runc as the local cluster's (demo/clusters/local/build-tools.sh),
# linked statically and without the seccomp tag, so it needs no libseccomp
# (nor any other library) on the GPU machine.
RUNC_VERSION=v1.3.3
MAX_BYTES=$((30 << 20))
arch=$("$GO" env GOARCH)

log() { echo "gpu-check-bundle: $*" >&2; }

# The applets run.sh uses to decompress and unpack.
busybox_has_applets() {
  local a list
  list=$(/bin/busybox --list) || return 1
  for a in unxz xz gzip tar unzip sha256sum; do
    grep -qx "$a" <<<"$list" || return 1
  done
}
if [ ! -x /bin/busybox ] || ! busybox_has_applets; then
  if [ "$(id -u)" != 0 ]; then
    echo "gpu-check-bundle: needs Debian's busybox-static (/bin/busybox): sudo apt-get install -y busybox-static" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q busybox-static >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q busybox-static >&2; }
fi
if ! file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' && ldd /bin/busybox >/dev/null 2>&1; then
  echo "gpu-check-bundle: /bin/busybox is dynamically linked; install busybox-static" >&2
  exit 1
fi

runc="$cache/gpu-check/runc-$RUNC_VERSION-static-$arch"
if [ ! -x "$runc" ]; then
  log "building a static runc $RUNC_VERSION (once; cached in $runc)"
  mkdir -p "$cache/src" "$(dirname "$runc")"
  src=$(GOFLAGS=-mod=mod "$GO" mod download -json "github.com/opencontainers/runc@$RUNC_VERSION" |
        sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  work="$cache/src/runc-$RUNC_VERSION-static"
  rm -rf "$work" && cp -r "$src" "$work" && chmod -R u+w "$work"
  sed -i '/^replace /d' "$work/go.mod"
  (cd "$work" && CGO_ENABLED=1 "$GO" build -trimpath -mod=mod -tags "netgo osusergo" \
    -ldflags "-s -w -extldflags -static" -o "$runc.tmp" .) >&2
  if ldd "$runc.tmp" >/dev/null 2>&1; then
    echo "gpu-check-bundle: $runc.tmp is not static" >&2
    exit 1
  fi
  mv "$runc.tmp" "$runc"
fi

rm -rf "$out"
mkdir -p "$out/rootfs/bin" "$out/results"
log "building the probe"
(cd "$repo" && CGO_ENABLED=1 "$GO" build -trimpath -ldflags "-s -w" -o "$out/tessera-gpu-probe" ./cmd/tessera-gpu-probe)
# The glibc symbol versions the probe needs: run.sh compares them with the
# GPU machine's glibc before it starts, so an old glibc is a clear message.
objdump -T "$out/tessera-gpu-probe" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | sed 's/GLIBC_//' >"$out/glibc-min"
# compress IN OUT: xz, cached by the input's checksum (a -trimpath build of
# unchanged sources is the same binary), so a rebuild of the bundle (the dry
# run in make unit) does not spend half a minute per run recompressing.
compress() {
  local sum cached
  sum=$(sha256sum "$1" | cut -c1-16)
  cached="$cache/gpu-check/xz-$sum"
  if [ ! -s "$cached" ]; then
    mkdir -p "$cache/gpu-check"
    find "$cache/gpu-check" -name 'xz-*' -mtime +7 -delete 2>/dev/null || true
    xz -T0 -6 -c "$1" >"$cached.tmp" && mv "$cached.tmp" "$cached"
  fi
  cp "$cached" "$2"
}
compress "$out/tessera-gpu-probe" "$out/tessera-gpu-probe.xz"
rm "$out/tessera-gpu-probe"
compress "$runc" "$out/runc.xz"
cp /bin/busybox "$out/rootfs/bin/busybox"
cp "$repo/internal/gpucheck/spin.ptx" "$out/spin.ptx"
cp "$repo/hack/gpu-check-run.sh" "$out/run.sh"
chmod 0755 "$out/run.sh" "$out/rootfs/bin/busybox"
touch "$out/results/.keep"
{
  echo "commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD -- 2>/dev/null || echo '+uncommitted')"
  echo "arch $arch"
  echo "runc $RUNC_VERSION (static, no seccomp)"
  echo "busybox $(/bin/busybox | head -1 | cut -d' ' -f2)"
  echo "glibc-min $(cat "$out/glibc-min")"
} >"$out/VERSION"
(cd "$out" && sha256sum tessera-gpu-probe.xz runc.xz rootfs/bin/busybox spin.ptx run.sh >SHA256SUMS)

bytes=$(du -sb "$out" | cut -f1)
log "$out: $(awk -v b="$bytes" 'BEGIN { printf "%.1f MiB", b / 1048576 }') ($bytes bytes; limit 30 MiB)"
(cd "$out" && du -b tessera-gpu-probe.xz runc.xz rootfs/bin/busybox spin.ptx run.sh) | sed 's/^/gpu-check-bundle:   /' >&2
if [ "$bytes" -gt "$MAX_BYTES" ]; then
  echo "gpu-check-bundle: the bundle is $bytes bytes, over the 30 MiB limit" >&2
  exit 1
fi
echo "$out"
