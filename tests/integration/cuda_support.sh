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
# A librefit_cuda.so of another build where an install's refit looks first is skipped unopened
# (its build text is read from the file), and so is a file that is no ELF library: the refit
# loads this build's from the next place. REFIT_INSTALL_LIBDIR and REFIT_CUDA_LIBRARY come from ctest.
if [ -n "${REFIT_CUDA_LIBRARY:-}" ]; then
  prefix="$(mktemp -d)"
  mkdir -p "$prefix/bin" "$prefix/$REFIT_INSTALL_LIBDIR/refit"
  cp "$refit" "$prefix/bin/refit"
  stale="$prefix/$REFIT_INSTALL_LIBDIR/refit/librefit_cuda.so"
  # The same library with its build text's refit version changed in place ("refit 0.6.0" -> "refit 9.6.0").
  python3 - "$REFIT_CUDA_LIBRARY" "$stale" <<'PY'
import sys
image = open(sys.argv[1], "rb").read()
at = image.index(b"refit 0.")
open(sys.argv[2], "wb").write(image[:at + 6] + b"9" + image[at + 7:])
PY
  for what in "another build's library" "a file that is no library"; do
    [ "$what" = "a file that is no library" ] && echo "not a library" > "$stale"
    log="$(REFIT_CUDA=on LD_DEBUG=files "$prefix/bin/refit" --version 2>&1)"
    grep -q 'CUDA support: loaded (REFIT_CUDA=on)' <<<"$log" || { echo "FAIL: with $what first, the CUDA support did not load: $log" | head -20; status=1; }
    if grep -q "file=$stale" <<<"$log"; then echo "FAIL: $what was loaded ($stale)"; status=1; fi
  done
  rm -rf "$prefix"
fi
out="$(mktemp -d)"
REFIT_CUDA=on "$expect" 0 'step 4/4' -- "$refit" train "$recipe" --set training.device=cpu --set training.duration=4:step \
  --set output.dir="$out" --set output.checkpoints.enabled=false || status=1
rm -rf "$out"
exit $status
