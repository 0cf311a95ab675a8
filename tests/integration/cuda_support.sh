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
# A librefit_cuda.so of another build where an install's refit looks first is skipped without
# being loaded (its build text is read from the file), and so is a file that is no ELF library:
# the refit loads this build's from the next place. REFIT_INSTALL_BINDIR, REFIT_LIBDIR_FROM_BINDIR
# and REFIT_CUDA_LIBRARY come from ctest.
if [ -n "${REFIT_CUDA_LIBRARY:-}" ]; then
  prefix="$(realpath "$(mktemp -d)")"  # the path the loader forms from /proc/self/exe
  bindir="$prefix/${REFIT_INSTALL_BINDIR:?}"
  mkdir -p "$bindir" "$bindir/${REFIT_LIBDIR_FROM_BINDIR:?}/refit"
  cp "$refit" "$bindir/refit"
  first="$(realpath "$bindir/$REFIT_LIBDIR_FROM_BINDIR/refit")/librefit_cuda.so"
  opened() { REFIT_CUDA=on LD_DEBUG=files "$bindir/refit" --version 2>&1; }
  # This build's own library there is the one loaded: the place is looked at first.
  cp "$REFIT_CUDA_LIBRARY" "$first"
  log="$(opened)"
  grep -qF "file=$first " <<<"$log" || { echo "FAIL: the install's place was not looked at first: $first"; status=1; }
  # Another build's: the interface hash in its build text changed in place (its first digit).
  if python3 - "$REFIT_CUDA_LIBRARY" "$first" <<'PY'
import sys
image = bytearray(open(sys.argv[1], "rb").read())
at = image.index(b", interface ") + len(b", interface ")
image[at] = ord("0") if image[at] != ord("0") else ord("1")
open(sys.argv[2], "wb").write(image)
PY
  then
    cmp -s "$REFIT_CUDA_LIBRARY" "$first" && { echo "FAIL: the stale copy equals the library"; status=1; }
  else
    echo "FAIL: could not write the stale library"; status=1
  fi
  for what in "another build's library" "a file that is no library"; do
    [ "$what" = "a file that is no library" ] && echo "not a library" > "$first"
    log="$(opened)"
    grep -q 'CUDA support: loaded (REFIT_CUDA=on)' <<<"$log" || { echo "FAIL: with $what first, the CUDA support did not load"; status=1; }
    if grep -qF "file=$first " <<<"$log"; then echo "FAIL: $what was loaded ($first)"; status=1; fi
  done
  rm -rf "$prefix"
fi
out="$(mktemp -d)"
REFIT_CUDA=on "$expect" 0 'step 4/4' -- "$refit" train "$recipe" --set training.device=cpu --set training.duration=4:step \
  --set output.dir="$out" --set output.checkpoints.enabled=false || status=1
rm -rf "$out"
exit $status
