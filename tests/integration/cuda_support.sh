#!/usr/bin/env bash
# cuda_support.sh REFIT RECIPE FILE...: LibTorch's CUDA half is loaded at run time, never linked
# (framework/cuda/cuda_support.h). No FILE (the CLI, the plugins) needs libtorch_cuda.so;
# REFIT_CUDA=off and =on are honoured on any machine, a CPU run trains with the CUDA half loaded,
# and a value that is not a mode is an error naming the variable.
set -u -o pipefail
refit="$1"; recipe="$2"; shift 2
command -v readelf >/dev/null || { echo "FAIL: readelf (binutils) not found"; exit 1; }
expect="$(dirname "$0")/expect.sh"
status=0
for f in "$refit" "$@"; do
  needed="$(readelf -d "$f")" || { echo "FAIL: readelf -d $f"; status=1; continue; }
  if grep -q 'NEEDED.*libtorch_cuda' <<<"$needed"; then echo "FAIL: $f needs libtorch_cuda.so"; status=1; fi
done
"$expect" 0 'CUDA support: (loaded \(REFIT_CUDA=auto: a CUDA driver is installed\)|not loaded \(REFIT_CUDA=auto: no CUDA driver)' \
  -- "$refit" --version || status=1
REFIT_CUDA=off "$expect" 0 'CUDA support: not loaded \(REFIT_CUDA=off\)' 'CUDA devices: 0' -- "$refit" --version || status=1
REFIT_CUDA=on "$expect" 0 'CUDA support: loaded \(REFIT_CUDA=on\)' 'CUDA runtime \(LibTorch build\) [0-9]+\.[0-9]+, CUDA devices' \
  -- "$refit" --version || status=1
REFIT_CUDA=maybe "$expect" 1 "refit's CUDA support: not loaded \(REFIT_CUDA=maybe: expected auto, on or off\)" \
  -- "$refit" --version || status=1
out="$(mktemp -d)"
REFIT_CUDA=on "$expect" 0 'step 4/4' -- "$refit" train "$recipe" --set training.device=cpu --set training.duration=4:step \
  --set output.dir="$out" --set output.checkpoints.enabled=false || status=1
rm -rf "$out"
exit $status
