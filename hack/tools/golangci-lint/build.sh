#!/usr/bin/env bash
# Builds the pinned golangci-lint (the tool in this directory's go.mod) into a cache
# dir outside the clone, so a second run (or a second clone) reuses it. It is built
# from the Go module proxy with `go build`, in this module, never the project's.
#
#   TESSERA_CACHE_DIR   where binaries go (default: ~/.cache/tessera)
#
# Prints the bin dir on the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}

# The bin dir is keyed by this module's go.mod and go.sum, so bumping the pin
# rebuilds; editing this script (comments, logging) does not.
key=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
bin="$cache/golangci-lint-$key"

if [ ! -x "$bin/golangci-lint" ]; then
  mkdir -p "$bin"
  echo "build-golangci-lint: building $(sed -n 's/^\tgithub.com\/golangci\/golangci-lint\/v2 \(v[^ ]*\).*/\1/p' "$here/go.mod")" >&2
  # The module's own go.sum pins every dependency: -mod=readonly refuses to build
  # anything go.mod and go.sum do not already name.
  (cd "$here" && go build -mod=readonly -trimpath -o "$bin/golangci-lint.tmp" \
    github.com/golangci/golangci-lint/v2/cmd/golangci-lint) >&2
  mv "$bin/golangci-lint.tmp" "$bin/golangci-lint"
fi

echo "$bin"
