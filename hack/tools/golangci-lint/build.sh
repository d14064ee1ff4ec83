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
# shellcheck source=SCRIPTDIR/../../lib/tools.sh
. "$here/../../lib/tools.sh"
version=$(sed -n 's/^\tgithub.com\/golangci\/golangci-lint\/v2 \(v[^ ]*\).*/\1/p' "$here/go.mod")
# The bin dir is keyed by this module's go.mod and go.sum, so bumping the pin
# rebuilds. The module's own go.sum pins every dependency: -mod=readonly refuses to
# build anything go.mod and go.sum do not already name.
build_pinned_tool "$here" golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint \
  "$version" -mod=readonly
