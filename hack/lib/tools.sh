# shellcheck shell=bash
# build_pinned_tool, shared by the scripts that build one pinned Go tool from a
# tools module of its own (hack/scale/build-kwok.sh, hack/tools/golangci-lint/build.sh);
# they source this file by its path relative to their own.

# build_pinned_tool MODULE_DIR NAME PACKAGE VERSION [GO_BUILD_FLAGS...]: builds
# PACKAGE inside the Go module in MODULE_DIR (never the project's) into
# CACHE/NAME-KEY/NAME unless it is there already, and prints that bin dir. CACHE is
# $TESSERA_CACHE_DIR [~/.cache/tessera]. KEY hashes the module's go.mod and go.sum,
# so bumping the pin rebuilds and editing a script (comments, logging) does not.
# VERSION is only logged. Every step is checked, so a failed build fails the call
# also inside $(...), where set -e does not reach.
build_pinned_tool() {
  local dir=$1 name=$2 pkg=$3 version=$4 cache key bin
  shift 4
  cache=${TESSERA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
  key=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-12) || return
  bin="$cache/$name-$key"
  if [ ! -x "$bin/$name" ]; then
    mkdir -p "$bin" || return
    echo "build-$name: building $name ($version) into $bin" >&2
    (cd "$dir" && go build "$@" -trimpath -o "$bin/$name.tmp" "$pkg") >&2 || return
    mv "$bin/$name.tmp" "$bin/$name" || return
  fi
  echo "$bin"
}
