#!/usr/bin/env bash
# distributed_nccl.sh REFIT TORCHRUN TENSOR_DIFF RECIPE WORK_DIR [--set k=v ...]
# NCCL on CUDA: every GPU of the machine one rank (torchrun), against one process with the same
# global batch. Exits 77 (ctest: skipped) without a CUDA device.
set -euo pipefail
refit="$1"; torchrun="$2"; diff="$3"; recipe="$4"; work="$5"; shift 5
command -v nvidia-smi > /dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true) || gpus=0
[ "${gpus:-0}" -ge 1 ] || { echo "no CUDA device: skipped"; exit 77; }
rm -rf "$work"; mkdir -p "$work"
n=$gpus; [ "$n" -le 8 ] || n=8
args=(--set training.device=cuda --set training.precision=fp32 "$@")
"$refit" train "$recipe" "${args[@]}" --set output.dir="$work/one" --set training.batch_size=$((8 * n)) > "$work/one.log" 2>&1 \
  || { tail -20 "$work/one.log"; exit 1; }
"$torchrun" --no-python --nproc-per-node "$n" --master-port $(( 20000 + RANDOM % 12000 )) \
  "$refit" train "$recipe" "${args[@]}" --set output.dir="$work/nccl" --set training.batch_size=8 > "$work/nccl.log" 2>&1 \
  || { tail -20 "$work/nccl.log"; exit 1; }
grep -q "rank 0 of $n (nccl" "$work/nccl.log" || { echo "FAIL: not an NCCL group"; grep data-parallel "$work/nccl.log"; exit 1; }
one="$work/one/checkpoints/$(cat "$work/one/checkpoints/latest")/trainable.safetensors"
nccl="$work/nccl/checkpoints/$(cat "$work/nccl/checkpoints/latest")/trainable.safetensors"
"$diff" "$one" "$nccl" 1e-5
echo "OK: $n NCCL rank(s)"
