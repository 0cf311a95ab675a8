# Sourced by the scripts: runs setup (idempotent) and exports the build environment.
_refit_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_refit_setup_out="$(bash "$_refit_root/scripts/setup.sh")"
REFIT_TORCH_CMAKE_PREFIX="$(tail -n 1 <<<"$_refit_setup_out")"
export REFIT_TORCH_CMAKE_PREFIX
# all-MiniLM-L6-v2's files (model.safetensors, config.json, vocab.txt, tokenizer*.json).
REFIT_MINILM_DIR="$(sed -n 's/^REFIT_MINILM_DIR=//p' <<<"$_refit_setup_out")"
export REFIT_MINILM_DIR
# SmolLM2-135M-Instruct as one GGUF file (weights, tokenizer, chat template).
REFIT_SMOLLM2_GGUF="$(sed -n 's/^REFIT_SMOLLM2_GGUF=//p' <<<"$_refit_setup_out")"
export REFIT_SMOLLM2_GGUF
unset _refit_setup_out
# ccache: paths relative to the checkout, so a fresh clone elsewhere hits the same cache.
export CCACHE_BASEDIR="$_refit_root"
export CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-include_file_mtime,include_file_ctime,time_macros,pch_defines}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
