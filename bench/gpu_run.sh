#!/usr/bin/env bash
# The GPU benchmark run, in one call on the lent GPU machine, after ../shared/device/gpu-check.sh
# has built build-gpu and run `ctest -L gpu`:
#   bash .device-deps/gpu-check.sh -- bash bench/gpu_run.sh
# Each comparison runs refit and its Python peer alternately in the same invocation.
set -uo pipefail
cd "$(dirname "$0")/.."
export REFIT_BUILD_DIR=${REFIT_BUILD_DIR:-build-gpu}
cp -n ../shared/anchors/anchor_*.py .device-deps/ 2>/dev/null || true
# Overhead-bound MLP: eager refit vs eager Python; graphed refit vs eager Python (target >= 10x,
# i.e. <= 0.58 ms/step); graphed refit vs Python's own whole-step CUDA graph.
python3 bench/compare.py mlp cuda 3 300
REFIT_BENCH_GRAPH=1 python3 bench/compare.py mlp cuda 3 300
python3 bench/compare.py mlp-floor cuda 3 300
# GPU-bound ViT-B/14 LoRA: target >= 1.8x PEFT eager with peak memory <= PEFT's; eager and graphed.
python3 bench/compare.py vitb cuda 2 30
REFIT_BENCH_GRAPH=1 python3 bench/compare.py vitb cuda 2 30
