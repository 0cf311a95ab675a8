#!/usr/bin/env bash
# import_libtorch.sh SOURCE_DIR TORCH_DIR WORK_DIR
# refit's LibTorch import (cmake/ImportLibTorch.cmake, used without a CUDA toolkit) against
# LibTorch's own CMake files: the same compile definitions, and a program using LibTorch's CPU
# and CUDA headers builds and runs. Skipped (77) where LibTorch's own files cannot configure.
set -euo pipefail
src="$1"; torch_dir="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
probe="$src/tests/cmake/import_libtorch"
defs() { grep -o 'REFIT-DEFINITIONS: .*' "$1" | cut -d' ' -f2-; }
if ! cmake -S "$probe" -B "$work/config" -G Ninja -DMODE=config -DTorch_DIR="$torch_dir" > "$work/config.log" 2>&1; then
  echo "LibTorch's own CMake files do not configure here (no CUDA toolkit?): nothing to compare"; exit 77
fi
cmake -S "$probe" -B "$work/import" -G Ninja -DMODE=import -DREFIT_SOURCE_DIR="$src" -DTorch_DIR="$torch_dir" \
  -DCMAKE_BUILD_TYPE=Release > "$work/import.log" 2>&1 || { cat "$work/import.log"; exit 1; }
echo "LibTorch's CMake files: $(defs "$work/config.log")"
echo "refit's import:         $(defs "$work/import.log")"
[ "$(defs "$work/config.log")" = "$(defs "$work/import.log")" ] || { echo "FAIL: the compile definitions differ"; exit 1; }
cmake --build "$work/import" > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
"$work/import/uses_libtorch"
