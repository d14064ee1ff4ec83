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
# A relative source path is the caller's directory's.
case "$hami_src" in ''|/*) ;; *) hami_src="$PWD/$hami_src" ;; esac
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

# Two directories, both removed at the end:
#   - $work, next to the bundle (the probe, the HAMi-core build): /tmp may be
#     mounted noexec, the bundle's own directory is where the user chose to
#     run programs from. When the bundle's directory is read-only, $TMPDIR.
#   - $state, a short path under $TMPDIR for the check's own state: the MPS
#     control socket lives under it and a socket path has at most 107 bytes.
work=$(mktemp -d "$here/.work.XXXXXX" 2>/dev/null) ||
  work=$(mktemp -d "${TMPDIR:-/tmp}/tgc-work.XXXXXX") ||
  die "cannot create a work directory in $here or ${TMPDIR:-/tmp}"
state=$(mktemp -d "${TMPDIR:-/tmp}/tgc.XXXXXX") || die "cannot create a state directory under ${TMPDIR:-/tmp}"
# No MPS daemon outlives the run, and none loses its pipe directory while
# it runs: before the state directory goes, every process whose
# CUDA_MPS_PIPE_DIRECTORY is under it (the check's daemons, their servers,
# a probe left behind) is asked to quit ("quit -t 5": the daemon forces its
# servers down after 5 s), given 10 s, and then killed by PID. The check
# does the same itself; this is for a check that was killed.
#
# mps_procs: "PID PIPE-DIRECTORY" of each such process, and "PID -" of each
# child of one (an MPS server need not carry the variable).
# shellcheck disable=SC2317 # run by the EXIT trap
mps_procs() {
  found=""
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" != "$$" ] || continue
    [ -r "$e" ] || continue
    d=$({ tr '\0' '\n' <"$e"; } 2>/dev/null | sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p' | head -1)
    case "$d" in "$state"/*) echo "$p $d"; found="$found $p " ;; esac
  done
  [ -n "$found" ] || return 0
  for s in /proc/[0-9]*/stat; do
    p=${s#/proc/}; p=${p%/stat}
    pp=$(sed 's/.*) //' "$s" 2>/dev/null | cut -d' ' -f2)
    case "$found" in *" $pp "*) case "$found" in *" $p "*) ;; *) echo "$p -" ;; esac ;; esac
  done
}
# shellcheck disable=SC2317 # run by the EXIT trap
stop_mps() {
  list=$(mps_procs)
  [ -n "$list" ] || return 0
  if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    for d in $(echo "$list" | cut -d' ' -f2 | grep -v '^-$' | sort -u); do
      (echo "quit -t 5" | CUDA_MPS_PIPE_DIRECTORY=$d timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1) &
    done
    wait
  fi
  i=0
  while [ -n "$(mps_procs)" ] && [ "$i" -lt 10 ]; do sleep 1; i=$((i + 1)); done
  pids=$(mps_procs | cut -d' ' -f1 | tr '\n' ' ')
  if [ -n "$pids" ]; then
    echo "run.sh: killing MPS processes left under $state: $pids" >&2
    # shellcheck disable=SC2086 # a list of PIDs
    kill -9 $pids 2>/dev/null || true
  fi
}
# shellcheck disable=SC2317 # run by the trap
cleanup() { stop_mps; rm -rf "$work" "$state"; }
trap cleanup EXIT
# Ctrl-C or TERM stops what runs (the HAMi-core build, the check: each is
# started in the background and waited for, so the shell takes the signal
# at once), waits for it to end (the check stops its daemons and probes),
# and then the EXIT trap cleans up.
child=""
# incomplete WHY: results/gpu-check.md for a check that judged nothing.
incomplete() {
  {
    echo "# Tessera real-GPU check: INCOMPLETE"
    echo
    echo "$1. Nothing below was judged; the log is results/run.log."
    echo
    sed 's/^/- /' "$notes"
  } >"$results/gpu-check.md"
  rm -f "$results/gpu-check.json"
  echo "run.sh: INCOMPLETE: $1" >&2
}
# shellcheck disable=SC2317 # run by the traps
on_signal() {
  trap '' INT TERM
  if [ -n "$child" ]; then
    echo "run.sh: SIG$1: stopping the running step (pid $child)" >&2
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  incomplete "run.sh was stopped by SIG$1"
  exit "$2"
}
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
probe="$work/tessera-gpu-probe"
"$bb" unxz -c "$here/tessera-gpu-probe.xz" >"$probe" || die "cannot decompress the probe into $work"
chmod 0755 "$probe"

# The probe must be executable where it was unpacked (a noexec mount says
# "Permission denied", status 126), and it is built with cgo against glibc:
# an older glibc than the build machine's refuses to load it. Say which.
set +e
out=$(timeout 20 "$probe" --help 2>&1)
rc=$?
set -e
if [ "$rc" = 126 ] || { [ "$rc" != 0 ] && [ ! -x "$probe" ]; }; then
  echo "$out" >&2
  die "cannot execute $probe (status $rc): is $(dirname "$probe")'s filesystem mounted noexec? Copy the bundle to a directory on a filesystem that allows programs (or set TMPDIR to one, if the bundle's directory is read-only)"
elif [ "$rc" != 0 ]; then
  echo "$out" >&2
  die "the probe does not start on this machine (status $rc; it needs glibc >= $(cat "$here/glibc-min"); see above)"
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
  # Not every environment shows the kernel module's /proc files (gVisor's
  # nvproxy, some VMs): a warning; the check itself finds out whether NVML
  # and CUDA work.
  if [ -e /proc/driver/nvidia/version ]; then
    note "driver: $(head -1 /proc/driver/nvidia/version)"
  else
    note "WARNING: /proc/driver/nvidia/version is missing (no NVIDIA kernel module, or a sandbox such as gVisor that does not show it); going on: the check fails by itself if NVML finds no GPU"
  fi
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
  # The container check runs the CDI spec in a container with the bundle's
  # static runc (root only; without root it uses a user namespace).
  if "$bb" unxz -c "$here/runc.xz" >"$work/runc" && chmod 0755 "$work/runc"; then
    set -- --runc "$work/runc" "$@"
  else
    note "WARNING: cannot decompress the bundle's runc: the container check uses its namespace fallback"
  fi
  # A client of uid 1000 (the MPS check) must reach the MPS pipe
  # directories under the state directory.
  chmod 0711 "$state"
else
  note "running as uid $uid (not root): steps that need root are reported as skipped"
fi
set -- --rootfs "$here/rootfs" "$@"

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
# directory) given by path, with cmake and nvcc, when there is one. What the
# machine lacks (no source given, no cmake or nvcc) is a skip; a source that
# was given but does not build is an ERROR of the HAMiCore backend, with the
# build log's tail.
hami_skip=""
hami_err=""
hami_lib=""
# log_tail FILE: its last lines on one line, for a report cell.
log_tail() { tail -n 15 "$1" 2>/dev/null | tr '\n' ' ' | cut -c1-1500; }
if [ -z "$hami_src" ]; then
  hami_skip="no HAMi-core source given (run.sh --hami-core-src PATH, a .tar.gz/.tar.xz/.zip of github.com/Project-HAMi/HAMi-core or a directory): HAMi-core is not part of Tessera"
elif [ ! -e "$hami_src" ]; then
  hami_err="--hami-core-src $hami_src: no such file or directory"
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
    unpacked=true
    case "$hami_src" in
      *.tar.xz|*.txz) "$bb" xz -dc "$hami_src" | "$bb" tar -x -C "$src" || unpacked=false ;;
      *.tar.gz|*.tgz) "$bb" gzip -dc "$hami_src" | "$bb" tar -x -C "$src" || unpacked=false ;;
      *.tar) "$bb" tar -xf "$hami_src" -C "$src" || unpacked=false ;;
      *.zip) "$bb" unzip -q "$hami_src" -d "$src" || unpacked=false ;;
      *) if [ -d "$hami_src" ]; then cp -R "$hami_src/." "$src/" || unpacked=false; else hami_err="--hami-core-src $hami_src: want a .tar.gz, .tar.xz, .zip or a directory"; fi ;;
    esac
    $unpacked || hami_err="--hami-core-src $hami_src: could not be unpacked"
    # The top-level CMakeLists.txt is the shallowest one (an archive holds
    # the project under one directory, and HAMi-core's src/ has its own).
    cmakelists=$(find "$src" -maxdepth 3 -name CMakeLists.txt | awk -F/ '{ print NF "\t" $0 }' | sort -n | head -1 | cut -f2-)
    top=$(dirname "${cmakelists:-/nonexistent/CMakeLists.txt}")
    if [ -z "$hami_err" ] && [ -z "$cmakelists" ]; then
      hami_err="--hami-core-src $hami_src: no CMakeLists.txt in its top three directory levels"
    elif [ -z "$hami_err" ]; then
      budget=$(( $(left) / 2 ))
      [ "$budget" -le 300 ] || budget=300
      note "HAMi-core: building $top with cmake and $nvcc (at most ${budget}s)"
      set +e
      # The options are HAMi-core's own build.sh's: its hooks, the
      # multiprocess limit, and a Debug build, whose library exports the cu*
      # hooks (a Release build hides all but dlsym and limits nothing: seen on
      # an H200, driver 580). CMAKE_POLICY_VERSION_MINIMUM: CMake 4 refuses
      # HAMi-core's cmake_minimum_required below 3.5 without it.
      # shellcheck disable=SC2016 # expanded by the inner sh
      timeout "$budget" sh -c 'cmake -S "$1" -B "$2" -DCMAKE_CUDA_COMPILER="$3" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DDLSYM_HOOK_ENABLE=1 -DMULTIPROCESS_LIMIT_ENABLE=1 -DHOOK_MEMINFO_ENABLE=1 -DHOOK_NVML_ENABLE=1 -DCMAKE_BUILD_TYPE=Debug && cmake --build "$2" -j "$(nproc 2>/dev/null || echo 4)"' \
        sh "$top" "$work/hami-build" "$nvcc" >"$results/hami-core-build.log" 2>&1 &
      child=$!
      wait "$child"
      brc=$?
      child=""
      set -e
      if [ "$brc" = 0 ]; then
        hami_lib=$(find "$work/hami-build" -name libvgpu.so | head -1)
        [ -n "$hami_lib" ] || hami_err="the HAMi-core build of $top succeeded but made no libvgpu.so; results/hami-core-build.log ends: $(log_tail "$results/hami-core-build.log")"
      else
        why="failed (status $brc)"
        case "$brc" in 124|137|143) why="ran out of its ${budget}s" ;; esac
        hami_err="building HAMi-core from $top $why; results/hami-core-build.log ends: $(log_tail "$results/hami-core-build.log")"
      fi
    fi
  fi
fi
if [ -n "$hami_lib" ]; then
  note "HAMi-core: $hami_lib"
  set -- --hami-core-library "$hami_lib" "$@"
elif [ -n "$hami_err" ]; then
  note "HAMi-core: ERROR: $hami_err"
  set -- --hami-core-error "$hami_err" "$@"
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
  --work-dir "$state/w" "$@" >"$results/run.log" 2>&1 &
child=$!
wait "$child"
rc=$?
child=""
set -e
cat "$results/run.log"
# coreutils' timeout exits 124 (137 after -k); busybox's 143 (SIGTERM).
timed_out=false
case "$rc" in 124|137|143) timed_out=true ;; esac
if $timed_out || [ ! -s "$results/gpu-check.md" ]; then
  why="the check exited with status $rc before writing its results"
  ! $timed_out || why="the check ran out of its ${budget}s (run.sh --timeout $timeout_s)"
  incomplete "$why"
  [ "$rc" != 0 ] || rc=1
fi
echo "run.sh: results in $results/gpu-check.md and $results/gpu-check.json ($(( $(date +%s) - start ))s)"
exit "$rc"
