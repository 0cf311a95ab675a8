#!/usr/bin/env bash
# The GPU tests and benchmarks in one command, on any Linux machine with an NVIDIA GPU, its
# driver and the CUDA toolkit (nvcc: LibTorch's CMake files need it), apt and PyPI:
#   bench/gpu_run.sh            (logs in $OUT if set, else build-gpu/gpu-run/)
# It sets the machine up as scripts/setup.sh does (Debian packages; the pinned torch wheel, a
# CUDA build; all-MiniLM-L6-v2), adds the Python peers' packages (pinned transformers, peft,
# timm; torchvision for timm) to that interpreter, builds everything in build-gpu/, runs the tests labelled gpu, then
# every GPU comparison: refit and its Python peer (bench/peer_*.py) alternately in one invocation.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${OUT:-$root/build-gpu/gpu-run}"
mkdir -p "$out"
log() { printf '[gpu_run] %s\n' "$*" >&2; }

command -v nvidia-smi >/dev/null && nvidia-smi -L || { log "no NVIDIA driver (nvidia-smi) on this machine"; exit 1; }
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [ -x "$d/nvcc" ] && { PATH="$d:$PATH"; break; }; done
fi
command -v nvcc >/dev/null || { log "no CUDA toolkit (nvcc): install CUDA 13 (LibTorch's CMake files need it)"; exit 1; }

source scripts/env.sh || { log "setup failed (scripts/setup.sh)"; exit 1; }
py="${REFIT_DEPS:-$HOME/.cache/refit}/torch-2.11.0/bin/python"
# The Python peers' packages, pinned (the versions the figures in docs/performance.md used).
peers_stamp="${py%/bin/python}/.refit-bench-peers"
if [ ! -f "$peers_stamp" ]; then
  log "installing the benchmark peers' packages (transformers, peft, timm)"
  # torchvision (timm needs it) pinned to the one built for torch 2.11.0, so pip keeps that torch.
  "$py" -m pip install -q --disable-pip-version-check transformers==5.24.0 peft==0.21.2 timm==1.0.29 \
    torchvision==0.26.0 "torch==$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')" >&2 \
    && touch "$peers_stamp" || { log "pip install failed"; exit 1; }
fi
"$py" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"' || exit 1
TORCH_CUDA_ARCH_LIST="$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')"
export TORCH_CUDA_ARCH_LIST PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c 'import torch, transformers, peft, timm; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "| transformers", transformers.__version__, "peft", peft.__version__, "timm", timm.__version__)'
  nvcc --version | tail -1; } | tee "$out/env.txt"

export REFIT_BUILD_DIR="$root/build-gpu"
launcher=(); command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# Unity batches of 8: the defaults (36, 20) keep two cores busy with the least CPU; with many
# cores (the GPU machine's 16), smaller batches finish sooner.
if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DREFIT_UNITY_BATCH_SIZE=8 -DREFIT_TEST_UNITY_BATCH_SIZE=8 \
         -DCMAKE_PREFIX_PATH="$REFIT_TORCH_CMAKE_PREFIX" "${launcher[@]}" \
       && cmake --build build-gpu -j "$(nproc)"; } > "$out/build.log" 2>&1; then
  log "build failed:"; grep -E -m 40 "error|Error" "$out/build.log"; exit 1
fi
log "build ok"
ctest --test-dir build-gpu -L gpu --output-on-failure 2>&1 | tee "$out/ctest-gpu.log" | tail -15

{
  # Overhead-bound MLP: eager refit vs eager Python; graphed refit vs eager Python (target >= 10x);
  # graphed refit vs Python's own whole-step CUDA graph.
  "$py" bench/compare.py mlp cuda 3 300
  REFIT_BENCH_GRAPH=1 "$py" bench/compare.py mlp cuda 3 300
  "$py" bench/compare.py mlp-floor cuda 3 300
  # GPU-bound ViT-B/14 LoRA: target >= 1.8x PEFT eager with peak memory <= PEFT's; eager, graphed,
  # and against torch.compile.
  "$py" bench/compare.py vitb cuda 2 30
  REFIT_BENCH_GRAPH=1 "$py" bench/compare.py vitb cuda 2 30
  VITB_VARIANT=compile "$py" bench/compare.py vitb cuda 1 30
  # The two recipe steps of the CPU table, on the GPU.
  "$py" bench/compare.py vit cuda 3 100
  "$py" bench/compare.py minilm cuda 3 50
} 2>&1 | tee "$out/bench.log"
