#!/usr/bin/env bash
# make gpu-check-dryrun (part of make unit, so of make test): the bundle's
# run.sh end to end against a mock GPU profile, as the GPU machine would run
# it but with nothing a GPU machine might lack:
#
#   - a clean root filesystem: the bundle, busybox (the only userland: sh,
#     timeout, sed, …), the glibc the probe links and a fake nvidia-smi and
#     /proc/driver/nvidia tree (the mock profile's own view); no Go, no bash,
#     no CUDA, no python — a hidden dependency of run.sh fails here;
#   - entered with unshare -m (a private /proc) and chroot, as nobody
#     (65534), with no network (unshare -n), the host's environment dropped;
#   - under timeout 600.
#
# It fails on a typo in run.sh, a file missing from the bundle, a check
# without an outcome, or results that do not say MOCK. Needs root (mount
# namespace, chroot); CI runs as root.
#
#   hack/gpu-check-dryrun.sh [BUNDLE]   default: build _output/gpu-check-bundle
#   GPU_CHECK_DRYRUN_MUTATIONS=1        also prove it fails on a typo, a
#                                       missing file and a hidden dependency
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The HGX H100 node with gpu-0 split into static MIG instances and gpu-1 in MIG
# mode without instances: the shares run on gpu-2, the MIG checks create and
# destroy instances on gpu-1.
profile=${GPU_CHECK_DRYRUN_PROFILE:-hgx-h100-mig}
log() { echo "gpu-check-dryrun: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  echo "gpu-check-dryrun: needs root (unshare -m, chroot, then drops to nobody); run it as root, as CI does" >&2
  exit 1
fi
started=$(date +%s)
bundle=${1:-}
if [ -z "$bundle" ]; then
  bundle=$("$repo/hack/gpu-check-bundle.sh" "$repo/_output/gpu-check-bundle" | tail -1)
fi
[ -f "$bundle/run.sh" ] || { echo "gpu-check-dryrun: $bundle is not a bundle (no run.sh)" >&2; exit 1; }

root=$(mktemp -d /tmp/tgc-dryrun.XXXXXX)
trap 'rm -rf "$root"' EXIT

# make_root DIR: the clean root filesystem with a fresh copy of the bundle.
make_root() {
  local r=$1 probe
  mkdir -p "$r"/{bin,usr/bin,sbin,tmp,proc,sys,dev,etc,fake}
  chmod 1777 "$r/tmp"
  cp "$bundle/rootfs/bin/busybox" "$r/bin/busybox"
  chroot "$r" /bin/busybox --install -s /bin
  mknod -m 666 "$r/dev/null" c 1 3
  mknod -m 666 "$r/dev/zero" c 1 5
  mknod -m 666 "$r/dev/urandom" c 1 9
  mknod -m 666 "$r/dev/full" c 1 7
  mknod -m 666 "$r/dev/random" c 1 8
  echo 'root:x:0:0:root:/root:/bin/sh' >"$r/etc/passwd"
  echo 'nobody:x:65534:65534:nobody:/nonexistent:/bin/sh' >>"$r/etc/passwd"
  echo 'nogroup:x:65534:' >"$r/etc/group"
  cp -a "$bundle" "$r/bundle"
  chown -R 65534:65534 "$r/bundle"
  # The libraries the probe links (glibc), as every GPU machine has them.
  probe="$r/tmp/probe"
  "$bundle/rootfs/bin/busybox" unxz -c "$bundle/tessera-gpu-probe.xz" >"$probe"
  chmod 0755 "$probe"
  ldd "$probe" | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
  done
  # The mock profile's ground truth, and an nvidia-smi that prints it.
  "$probe" mock-ground-truth --mock-profile "$profile" --out "$r/fake"
  rm "$probe"
  cat >"$r/usr/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# The dry run's nvidia-smi: the mock profile's GPUs, for --query-gpu only.
case "$*" in *--query-gpu=uuid,pci.bus_id,memory.total*) cat /fake/nvidia-smi.csv ;; *) echo "fake nvidia-smi: $*: not faked" >&2; exit 2 ;; esac
EOF
  chmod 0755 "$r/usr/bin/nvidia-smi"
}

# write_enter DIR COMMAND: DIR/enter.sh, which enter_root runs as root in
# the new root: it drops the old root and runs COMMAND (a busybox sh
# command line, in which $1 is the profile) as nobody, the host's
# environment dropped.
write_enter() {
  {
    cat <<'EOF'
#!/bin/sh
# Written by hack/gpu-check-dryrun.sh: run after pivot_root, as root.
set -e
umount -l /.oldroot
rmdir /.oldroot
EOF
    printf 'exec su -s /bin/sh nobody -c "exec /bin/env -i PATH=/usr/bin:/bin HOME=/tmp TMPDIR=/tmp %s"\n' "$2"
  } >"$1/enter.sh"
  chmod 0755 "$1/enter.sh"
}

# enter_root SECONDS DIR [UNSHARE_FLAG...]: DIR/enter.sh with the profile as
# its argument, in DIR as the root (pivot_root) with its own /proc and
# /sys, in new mount and network namespaces (and those the flags add), for
# at most SECONDS.
enter_root() {
  local secs=$1 dir=$2
  shift 2
  # shellcheck disable=SC2016 # expanded by the inner sh
  timeout "$secs" unshare -m -n "$@" sh -c '
    mount --make-rprivate / || exit 97
    mount --bind "$1" "$1" || exit 97
    mount -t proc proc "$1/proc" || exit 97
    mount -t sysfs sysfs "$1/sys" || exit 97
    mkdir -p "$1/.oldroot"
    cd "$1" && pivot_root . .oldroot || exit 97
    exec /bin/busybox sh /enter.sh "$2"
  ' sh "$dir" "$profile"
}

# run_in DIR: run.sh in DIR's root as nobody, no network, a private /proc.
# The root is entered with pivot_root, not chroot: the kernel refuses a
# user namespace to a chrooted process, and the check's container fallback
# (a user and mount namespace, as unshare -rm) must run for real here.
# enter.sh (busybox sh, in the root) then drops the host's root and becomes
# nobody with busybox's su.
run_in() {
  # shellcheck disable=SC2016 # expanded by enter.sh
  write_enter "$1" '/bin/sh -c '"'"'cd /bundle && ./run.sh --mock $1 --timeout 300 -- --proc-driver-nvidia /fake/proc/driver/nvidia --compute-time 1s'"'"
  enter_root 600 "$1"
}

# run_term_in DIR: run.sh in DIR's root as nobody, in a PID namespace of
# its own (so that what it leaves behind is visible, and only that), sent
# SIGTERM once its check runs; term-test.sh (below) then says whether it
# stopped, left no process and no state directory, and said INCOMPLETE.
run_term_in() {
  # shellcheck disable=SC2016 # expanded by enter.sh
  write_enter "$1" '/bin/sh /term-test.sh $1'
  cat >"$1/term-test.sh" <<'EOF'
#!/bin/sh
# Written by hack/gpu-check-dryrun.sh: SIGTERM to run.sh while its check runs.
fail() { echo "term-test: FAIL: $*"; exit 1; }
# probes: the PIDs of the processes (this PID namespace's) that run
# tessera-gpu-probe: the check, its probes, nsexec (not busybox timeout's
# watcher, which names it as an argument and ends within a second).
probes() {
  for c in /proc/[0-9]*/cmdline; do
    if { tr '\0' '\n' <"$c" | head -1 | grep -q 'tessera-gpu-probe$'; } 2>/dev/null; then p=${c#/proc/}; echo "${p%/cmdline}"; fi
  done
}
cd /bundle || exit 1
./run.sh --mock "$1" --timeout 300 -- --proc-driver-nvidia /fake/proc/driver/nvidia --compute-time 3s >/tmp/term-run.out 2>&1 &
pid=$!
i=0
until grep -q 'backend\|Publishes' results/run.log 2>/dev/null || [ -n "$(ls /tmp/tgc.*/w/cdi 2>/dev/null)" ]; do
  sleep 0.2; i=$((i + 1))
  [ "$i" -lt 600 ] || fail "the check never started: $(cat /tmp/term-run.out)"
done
sleep 2
[ -n "$(probes)" ] || fail "no probe process runs: nothing to stop"
start=$(date +%s)
kill -TERM "$pid"
wait "$pid"
rc=$?
took=$(( $(date +%s) - start ))
echo "term-test: run.sh exited $rc ${took}s after SIGTERM"
[ "$rc" = 143 ] || fail "run.sh exited $rc after SIGTERM, want 143: $(tail -5 /tmp/term-run.out)"
[ "$took" -le 60 ] || fail "run.sh took ${took}s to stop"
left=$(probes)
[ -z "$left" ] || fail "processes left after run.sh ended: $left"
! ls -d /tmp/tgc.* >/dev/null 2>&1 || fail "the state directory is left: $(ls -d /tmp/tgc.*)"
! ls -d /bundle/.work.* >/dev/null 2>&1 || fail "the work directory is left"
grep -q INCOMPLETE results/gpu-check.md || fail "results/gpu-check.md does not say INCOMPLETE"
echo "term-test: ok"
EOF
  chmod 0755 "$1/term-test.sh"
  enter_root 300 "$1" -p -f
}

make_root "$root/ok"
log "running the bundle's run.sh in a clean root as nobody, no network (mock profile $profile)"
set +e
run_in "$root/ok"
rc=$?
set -e
res="$root/ok/bundle/results"
fail() { echo "gpu-check-dryrun: FAIL: $*" >&2; exit 1; }
[ "$rc" = 0 ] || fail "run.sh exited $rc (want 0)"
if [ ! -s "$res/gpu-check.md" ] || [ ! -s "$res/gpu-check.json" ]; then fail "no results/gpu-check.md or .json"; fi
grep -q 'MOCK RUN' "$res/gpu-check.md" || fail "gpu-check.md does not say it is a mock run"
grep -q '"complete":true' "$res/gpu-check.json" || fail "the report is not complete"
grep -q '"mock":true' "$res/gpu-check.json" || fail "the report is not marked mock"
grep -q 'running as uid 65534' "$res/gpu-check.md" || fail "run.sh did not run as nobody"
for c in 'discovery vs nvidia-smi | simulated' 'discovery vs /proc/driver/nvidia | simulated' \
         'compute mode (read only) | simulated' 'backend MPS | simulated' 'backend Advisory | simulated' \
         'backend HAMiCore | skipped | no HAMi-core source given' 'backend DriverMemory | skipped | ' \
         'CDI spec applied in a container: Advisory | simulated (mock) | nsexec in a new user and mount namespace' \
         'CDI spec applied in a container: MPS | simulated (mock) | nsexec in a new user and mount namespace' \
         'CDI spec applied in a container: HAMiCore | skipped | no HAMi-core source given' \
         'MPS: a root client, then a uid-1000 client (bounded wait) | skipped | not root' \
         'MPS: two trust domains on one GPU (servers time-slice) | simulated' \
         "MPS: memory of a server's context | simulated" \
         'HAMi-core: cuMemAllocAsync, VMM (cuMemCreate), managed memory refused past the limit | skipped | no HAMi-core source given' \
         "health-event registration (pkg/health's watcher) | simulated" \
         'lending sampler readings during the probes | simulated' \
         'MIG: an instance created and destroyed through prepare and unprepare | simulated' \
         "MIG: a process in the instance sees the profile's memory | simulated" \
         "MIG: a process in one instance cannot see or allocate another's | simulated"; do
  grep -qF "| $c" "$res/gpu-check.md" || fail "gpu-check.md lacks \"| $c\""
done
# The container fallback ran for real: the probe saw the spec's device
# nodes (stand-ins) and mounts inside.
grep -q 'CDI spec applied in a container: MPS | simulated (mock) |.* 3 device nodes .* 2 mounts as the spec says' "$res/gpu-check.md" ||
  fail "the MPS container did not show the spec's device nodes and mounts"
! grep -qi 'not implemented' "$res/gpu-check.md" || fail "gpu-check.md still lists a check as not implemented"
grep -q 'DriverMemory | skipped | .*driver 580' "$res/gpu-check.md" || fail "DriverMemory's skip does not name the driver version"
cp "$res/gpu-check.md" "$repo/_output/gpu-check-dryrun.md" 2>/dev/null || true
log "ok: run.sh passed in the clean root ($(( $(date +%s) - started ))s so far)"

# SIGTERM (an outer timeout, Ctrl-C's cousin) stops the check and cleans up.
make_root "$root/term"
log "sending SIGTERM to run.sh while its check runs"
if ! run_term_in "$root/term" >"$root/term.log" 2>&1; then
  cat "$root/term.log" >&2
  fail "run.sh did not stop cleanly on SIGTERM"
fi
log "ok: $(grep 'exited' "$root/term.log")"

if [ "${GPU_CHECK_DRYRUN_MUTATIONS:-0}" = 1 ]; then
  # Each mutation must make the dry run fail. The checksums are made
  # again after the edit, as make gpu-check-bundle would make them from a
  # broken hack/gpu-check-run.sh, so what fails is the broken part itself.
  mutate() {
    local name=$1 edit=$2 r="$root/m-$1"
    make_root "$r"
    (cd "$r/bundle" && eval "$edit" &&
      sha256sum tessera-gpu-probe.xz runc.xz rootfs/bin/busybox spin.ptx run.sh >SHA256SUMS)
    if run_in "$r" >"$root/m-$name.log" 2>&1; then
      fail "a bundle with $name passed the dry run"
    fi
    log "ok: a bundle with $name fails ($(tail -1 "$root/m-$name.log"))"
  }
  mutate typo 'sed -i "0,/; then$/s//; thne/" run.sh'
  mutate missing-file 'rm VERSION'
  # shellcheck disable=SC2016 # a literal edit of run.sh
  mutate hidden-dependency 'sed -i "s|^start=\$(date +%s)$|start=\$(date +%s); jq --version >/dev/null|" run.sh'
fi
log "done in $(( $(date +%s) - started ))s"
