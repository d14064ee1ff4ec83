#!/bin/sh
# run.sh: Tessera's real-GPU check in one shot (the bundle's entry point, made
# by `make gpu-check-bundle` from hack/gpu-check-run.sh; docs/gpu-check.md).
#
#   ./run.sh [--hami-core-src PATH] [--timeout SECONDS] [--node-name NAME]
#            [--results DIR] [--mock PROFILE] [-- CHECK-FLAGS...]
#
# Needs only the NVIDIA driver (and, to build HAMi-core, cmake and nvcc): no
# Go, no Kubernetes, no network, no root. Everything runs under `timeout`
# (default 540 s in all). It prints a summary table, writes
# results/gpu-check.md and results/gpu-check.json, and exits 0 only when every
# check was measured or skipped with a stated reason and every measured target
# was met; 1 otherwise; 2 when the check could not run at all.
#
# POSIX sh on purpose: the GPU machine's /bin/sh may be dash, and the dry run
# (make gpu-check-dryrun) runs this under busybox's ash with nothing else.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
bb="$here/rootfs/bin/busybox"
timeout_s=540
hami_src=""
node=""
mock=""
results="$here/results"

die() { echo "run.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hami-core-src) [ $# -ge 2 ] || die "--hami-core-src needs a path"; hami_src=$2; shift 2 ;;
    --hami-core-src=*) hami_src=${1#*=}; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; timeout_s=$2; shift 2 ;;
    --timeout=*) timeout_s=${1#*=}; shift ;;
    --node-name) [ $# -ge 2 ] || die "--node-name needs a name"; node=$2; shift 2 ;;
    --node-name=*) node=${1#*=}; shift ;;
    --results) [ $# -ge 2 ] || die "--results needs a directory"; results=$2; shift 2 ;;
    --results=*) results=${1#*=}; shift ;;
    --mock) [ $# -ge 2 ] || die "--mock needs a profile (e.g. hgx-h100)"; mock=$2; shift 2 ;;
    --mock=*) mock=${1#*=}; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument $1 (see ./run.sh --help; flags for the check itself go after --)" ;;
  esac
done
case "$timeout_s" in ''|*[!0-9]*) die "--timeout $timeout_s: want whole seconds" ;; esac
[ "$timeout_s" -ge 60 ] || die "--timeout $timeout_s: want at least 60 seconds"

start=$(date +%s)
left() { echo $((timeout_s - ($(date +%s) - start))); }

mkdir -p "$results" || die "cannot create the results directory $results"
rm -f "$results/gpu-check.md" "$results/gpu-check.json" "$results/run.log"
notes="$results/notes.txt"
: >"$notes"
note() { echo "$*" >>"$notes"; echo "run.sh: $*"; }

# The bundle must be whole: a truncated copy fails here, not halfway.
[ -x "$bb" ] || die "$bb is missing or not executable: copy the whole bundle"
(cd "$here" && "$bb" sha256sum -c -s SHA256SUMS) || die "the bundle's files do not match SHA256SUMS: copy it again"

# shellcheck disable=SC2034 # read by the sed below
want_arch=$(sed -n 's/^arch //p' "$here/VERSION")
case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64|arm64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
[ "$arch" = "$want_arch" ] || die "this bundle is for $want_arch, this machine is $arch: build one there with make gpu-check-bundle"

work=$(mktemp -d "${TMPDIR:-/tmp}/tgc.XXXXXX") || die "cannot create a work directory under ${TMPDIR:-/tmp}"
# shellcheck disable=SC2317 # run by the trap
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
probe="$work/tessera-gpu-probe"
"$bb" unxz -c "$here/tessera-gpu-probe.xz" >"$probe" || die "cannot decompress the probe"
chmod 0755 "$probe"

# The probe is built with cgo against glibc: an older glibc than the build
# machine's refuses to load it. Say so, with the version it needs.
if ! out=$(timeout 20 "$probe" --help 2>&1); then
  echo "$out" >&2
  die "the probe does not start on this machine (it needs glibc >= $(cat "$here/glibc-min"); see above)"
fi

# The driver's user-space libraries: LD_LIBRARY_PATH first, then the places
# drivers are installed (distribution packages, the .run installer, the GPU
# operator's /run/nvidia/driver, containers' /usr/local/nvidia, WSL), then
# ldconfig's cache when there is one.
find_lib() {
  IFS_save=$IFS; IFS=:
  # shellcheck disable=SC2086 # split on ":" on purpose
  for d in ${LD_LIBRARY_PATH:-} /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib \
    /usr/local/nvidia/lib64 /usr/local/nvidia/lib /run/nvidia/driver/usr/lib/x86_64-linux-gnu \
    /run/nvidia/driver/usr/lib64 /usr/lib/wsl/lib; do
    if [ -n "$d" ] && [ -e "$d/$1" ]; then IFS=$IFS_save; echo "$d"; return 0; fi
  done
  IFS=$IFS_save
  if command -v ldconfig >/dev/null 2>&1; then
    p=$(ldconfig -p 2>/dev/null | sed -n "s/^[[:space:]]*$1 .*=> //p" | head -1)
    if [ -n "$p" ]; then dirname "$p"; return 0; fi
  fi
  return 1
}

if [ -n "$mock" ]; then
  note "MOCK RUN (--mock $mock): no GPU, no driver; probes are simulated from the prepared specs' variables. No figure here is what a GPU does."
  set -- --mock-profile "$mock" "$@"
else
  [ -e /proc/driver/nvidia/version ] ||
    die "no NVIDIA kernel driver on this machine (/proc/driver/nvidia/version is missing); the check needs an NVIDIA GPU and its driver"
  note "driver: $(head -1 /proc/driver/nvidia/version)"
  for lib in libnvidia-ml.so.1 libcuda.so.1; do
    dir=$(find_lib "$lib") || die "$lib not found in LD_LIBRARY_PATH, the usual driver directories or ldconfig's cache; set LD_LIBRARY_PATH to the driver's library directory"
    case ":${LD_LIBRARY_PATH:-}:" in *":$dir:"*) ;; *) LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
    note "$lib: $dir"
  done
  export LD_LIBRARY_PATH
fi

uid=$(id -u)
if [ "$uid" = 0 ]; then
  note "running as root"
else
  note "running as uid $uid (not root): steps that need root are reported as skipped"
fi

# MPS: the driver's control program, in PATH or where drivers put it.
if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  for d in /usr/bin /usr/local/nvidia/bin /run/nvidia/driver/usr/bin; do
    if [ -x "$d/nvidia-cuda-mps-control" ]; then PATH="$PATH:$d"; break; fi
  done
fi
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  note "MPS: $(command -v nvidia-cuda-mps-control)"
elif [ -z "$mock" ]; then
  note "MPS: nvidia-cuda-mps-control not found in PATH, /usr/bin, /usr/local/nvidia/bin or /run/nvidia/driver/usr/bin: MPS is skipped"
fi

# HAMi-core is not part of Tessera: built here from a source archive (or
# directory) given by path, with cmake and nvcc, when there is one.
hami_skip=""
hami_lib=""
if [ -z "$hami_src" ]; then
  hami_skip="no HAMi-core source given (run.sh --hami-core-src PATH, a .tar.gz/.tar.xz/.zip of github.com/Project-HAMi/HAMi-core or a directory): HAMi-core is not part of Tessera"
elif [ ! -e "$hami_src" ]; then
  hami_skip="--hami-core-src $hami_src: no such file or directory"
else
  nvcc=$(command -v nvcc 2>/dev/null || true)
  [ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } || true
  if ! command -v cmake >/dev/null 2>&1; then
    hami_skip="cmake not found: cannot build HAMi-core from $hami_src"
  elif [ -z "$nvcc" ]; then
    hami_skip="nvcc not found (PATH, /usr/local/cuda/bin): cannot build HAMi-core from $hami_src"
  else
    src="$work/hami-src"
    mkdir -p "$src"
    case "$hami_src" in
      *.tar.xz|*.txz) "$bb" xz -dc "$hami_src" | "$bb" tar -x -C "$src" ;;
      *.tar.gz|*.tgz|*.tar) "$bb" tar -xf "$hami_src" -C "$src" ;;
      *.zip) "$bb" unzip -q "$hami_src" -d "$src" ;;
      *) if [ -d "$hami_src" ]; then cp -R "$hami_src/." "$src/"; else hami_skip="--hami-core-src $hami_src: want a .tar.gz, .tar.xz, .zip or a directory"; fi ;;
    esac
    cmakelists=$(find "$src" -maxdepth 3 -name CMakeLists.txt | head -1)
    top=$(dirname "${cmakelists:-/nonexistent/CMakeLists.txt}")
    if [ -z "$hami_skip" ] && [ -z "$cmakelists" ]; then
      hami_skip="--hami-core-src $hami_src: no CMakeLists.txt in it"
    elif [ -z "$hami_skip" ]; then
      budget=$(( $(left) / 2 ))
      [ "$budget" -le 300 ] || budget=300
      note "HAMi-core: building $hami_src with cmake and $nvcc (at most ${budget}s)"
      # shellcheck disable=SC2016 # expanded by the inner sh
      if timeout "$budget" sh -c 'cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$3" && cmake --build "$2" -j "$(nproc 2>/dev/null || echo 4)"' \
          sh "$top" "$work/hami-build" "$nvcc" >"$results/hami-core-build.log" 2>&1; then
        hami_lib=$(find "$work/hami-build" -name libvgpu.so | head -1)
        [ -n "$hami_lib" ] || hami_skip="the HAMi-core build made no libvgpu.so (results/hami-core-build.log)"
      else
        hami_skip="building HAMi-core from $hami_src failed or timed out (results/hami-core-build.log)"
      fi
    fi
  fi
fi
if [ -n "$hami_lib" ]; then
  note "HAMi-core: $hami_lib"
  set -- --hami-core-library "$hami_lib" "$@"
else
  note "HAMi-core: skipped: $hami_skip"
  set -- --hami-core-skip-reason "$hami_skip" "$@"
fi
[ -z "$node" ] || set -- --node-name "$node" "$@"

# The rest of the time, less a margin to write the results, is the check's.
budget=$(( $(left) - 15 ))
[ "$budget" -ge 30 ] || die "only ${budget}s left of --timeout $timeout_s for the check itself"
set +e
timeout -s TERM -k 10 "$budget" "$probe" check --results-dir "$results" --notes-file "$notes" \
  --work-dir "$work/w" "$@" >"$results/run.log" 2>&1
rc=$?
set -e
cat "$results/run.log"
# coreutils' timeout exits 124 (137 after -k); busybox's 143 (SIGTERM).
timed_out=false
case "$rc" in 124|137|143) timed_out=true ;; esac
if $timed_out || [ ! -s "$results/gpu-check.md" ]; then
  why="the check exited with status $rc before writing its results"
  ! $timed_out || why="the check ran out of its ${budget}s (run.sh --timeout $timeout_s)"
  {
    echo "# Tessera real-GPU check: INCOMPLETE"
    echo
    echo "$why. Nothing below was judged; the log is results/run.log."
    echo
    sed 's/^/- /' "$notes"
  } >"$results/gpu-check.md"
  echo "run.sh: INCOMPLETE: $why" >&2
  [ "$rc" != 0 ] || rc=1
fi
echo "run.sh: results in $results/gpu-check.md and $results/gpu-check.json ($(( $(date +%s) - start ))s)"
exit "$rc"
