#!/usr/bin/env bash
# Builds the pinned kwok binary (hack/scale/tools/go.mod) into a cache dir outside
# the clone, keyed by that module's go.mod and go.sum, so a warm run does not
# rebuild. Prints the binary's path on the last line of stdout.
#
#   TESSERA_CACHE_DIR   where binaries go (default: ~/.cache/tessera)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
key=$(cat "$here/tools/go.mod" "$here/tools/go.sum" | sha256sum | cut -c1-12)
bin="$cache/kwok-$key"
if [ ! -x "$bin/kwok" ]; then
  mkdir -p "$bin"
  echo "build-kwok: building kwok ($(awk '/^require sigs.k8s.io\/kwok/ {print $3}' "$here/tools/go.mod")) into $bin" >&2
  (cd "$here/tools" && go build -trimpath -o "$bin/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok) >&2
  mv "$bin/kwok.tmp" "$bin/kwok"
fi
echo "$bin/kwok"
