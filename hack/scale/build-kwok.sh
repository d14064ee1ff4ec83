#!/usr/bin/env bash
# Builds the pinned kwok binary (hack/scale/tools/go.mod) into a cache dir outside
# the clone, keyed by that module's go.mod and go.sum, so a warm run does not
# rebuild. Prints the binary's path on the last line of stdout.
#
#   TESSERA_CACHE_DIR   where binaries go (default: ~/.cache/tessera)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=SCRIPTDIR/../lib/tools.sh
. "$here/../lib/tools.sh"
version=$(awk '/^require sigs.k8s.io\/kwok/ {print $3}' "$here/tools/go.mod")
bin=$(build_pinned_tool "$here/tools" kwok sigs.k8s.io/kwok/cmd/kwok "$version")
echo "$bin/kwok"
