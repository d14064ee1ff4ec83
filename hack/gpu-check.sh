#!/usr/bin/env bash
# make gpu-check: Tessera's real-GPU check (docs/gpu-check.md). Fails fast,
# before building anything, on a machine without an NVIDIA GPU and driver.
# Arguments are passed to "tessera-gpu-probe check".
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin="${BIN:-$repo/bin}"

if [[ ! -e /proc/driver/nvidia/version ]]; then
  echo "gpu-check: no NVIDIA kernel driver on this machine (/proc/driver/nvidia/version is missing)." >&2
  echo "gpu-check: it needs an NVIDIA GPU with its driver; see docs/gpu-check.md." >&2
  exit 2
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "gpu-check: the driver's libcuda.so.1 is not on the loader path (ldconfig -p); install the driver's user-space libraries." >&2
  exit 2
fi

(cd "$repo" && CGO_ENABLED=1 "${GO:-go}" build -o "$bin/tessera-gpu-probe" ./cmd/tessera-gpu-probe)
exec "$bin/tessera-gpu-probe" check "$@"
