#!/usr/bin/env bash
# The scale check (docs/quantization.md, "Models bigger than the machine's patience"): LoRA steps
# on a TinyLlama-1.1B-shaped Llama whose sharded bf16 checkpoint make_scale_llama.py writes, with
# the frozen base stored in bf16 and in NF4. Prints, per storage, the time to build and load the
# model, the process's peak RSS (refit's own line and /usr/bin/time's), and the training time.
#
#   bench/scale/run.sh [bf16] [nf4]        (default: both; ~2.2 GB of weights under build/scale)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-${REFIT_DEPS:-$HOME/.cache/refit}/torch-2.11.0/bin/python}"   # scripts/setup.sh's interpreter (numpy)
[ -x "$py" ] || py=python3
refit="${REFIT:-$root/build/refit}"
export REFIT_SCALE_DIR="${REFIT_SCALE_DIR:-$root/build/scale/tinyllama}"
out="${REFIT_SCALE_RUNS:-$root/build/scale/runs}"
[ -f "$REFIT_SCALE_DIR/model.safetensors.index.json" ] || "$py" "$root/bench/scale/make_scale_llama.py" "$REFIT_SCALE_DIR"
mkdir -p "$out"
cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1), $(nproc) cores"
storages=("$@")
[ ${#storages[@]} -gt 0 ] || storages=(bf16 nf4)
for dtype in "${storages[@]}"; do
  export REFIT_SCALE_DTYPE="$dtype" REFIT_SCALE_OUT="$out/$dtype"
  rm -rf "$REFIT_SCALE_OUT"
  # The host allocator's cache (refit train --host-cache-mib, 1 GiB by default) keeps freed step
  # tensors for reuse: at 256 MiB it still serves this batch's activations, and the peak measures
  # the model, not the cache.
  /usr/bin/time -f "%M %e" -o "$out/$dtype.time" "$refit" train "$root/bench/scale/tinyllama-lora.json" \
    --host-cache-mib "${REFIT_SCALE_HOST_CACHE_MIB:-256}" >"$out/$dtype.log" 2>&1 ||
    { tail -n 20 "$out/$dtype.log"; exit 1; }
  read -r rss_kb wall <"$out/$dtype.time"
  loaded="$(sed -n 's/^models: built and loaded in \([0-9.]* s\).*/\1/p' "$out/$dtype.log")"
  done_line="$(grep '^done:' "$out/$dtype.log")"
  printf '%-5s peak RSS %6.2f GB  built+loaded in %s  %s  (wall %s s)\n' "$dtype" \
    "$(awk "BEGIN {print $rss_kb * 1024 / 1e9}")" "$loaded" "$done_line" "$wall"
done
echo "CPU: $cpu"
