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
# libcuda.so.1 on LD_LIBRARY_PATH (where drivers outside the distribution's
# paths often are) or in ldconfig's cache.
found=""
IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${dirs[@]}"; do [[ -n "$d" && -e "$d/libcuda.so.1" ]] && found=$d && break; done
if [[ -z "$found" ]] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "gpu-check: the driver's libcuda.so.1 is neither on LD_LIBRARY_PATH nor in ldconfig's cache; set LD_LIBRARY_PATH to the driver's library directory." >&2
  exit 2
fi

(cd "$repo" && CGO_ENABLED=1 "${GO:-go}" build -o "$bin/tessera-gpu-probe" ./cmd/tessera-gpu-probe)
exec "$bin/tessera-gpu-probe" check "$@"
