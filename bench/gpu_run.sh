#!/usr/bin/env bash
# The GPU benchmark run, in one call on the lent GPU machine, after ../shared/device/gpu-check.sh
# has built build-gpu and run `ctest -L gpu`:
#   bash .device-deps/gpu-check.sh -- bash bench/gpu_run.sh
# Each comparison runs refit and its Python peer alternately in the same invocation.
set -uo pipefail
cd "$(dirname "$0")/.."
export REFIT_BUILD_DIR=${REFIT_BUILD_DIR:-build-gpu}
cp -n ../shared/anchors/anchor_*.py .device-deps/ 2>/dev/null || true
python3 bench/compare.py mlp cuda 3 300      # overhead-bound: target <= 0.58 ms/step (the CUDA-graph floor)
python3 bench/compare.py vitb cuda 2 30      # GPU-bound: target >= 1.8x PEFT eager, peak memory <= PEFT's
