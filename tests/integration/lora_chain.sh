#!/usr/bin/env bash
# lora_chain.sh REFIT RECIPES_DIR WORK_DIR [PYTHON]
# The LoRA example end to end: pretrain an MLP (fp32) → export its weights → freeze it in bf16,
# attach LoRA, train under bf16-mixed → export a PEFT adapter and merged weights (bf16, and
# float32 with --dtype float32). Checks that both runs learned (learned.py: the loss fell, the val
# accuracy above the chance floor of its 1024 samples, majority share about 0.14 + 5 x 0.011),
# that LoRA moved the frozen model from chance on task B to a real accuracy, and that the files
# exist with the expected dtypes.
set -euo pipefail
refit="$1"; recipes="$2"; work="$3"; python="${4:-python3}"
learned="$(cd "$(dirname "$0")" && pwd)/learned.py"
rm -rf "$work"; mkdir -p "$work"
"$refit" train "$recipes/lora/pretrain-mlp.json" --set output.dir="$work/pretrain" | tail -2
"$python" "$learned" --ran --loss-falls --accuracy val accuracy data:val \
  -- "$refit" train "$recipes/lora/pretrain-mlp.json" --set output.dir="$work/pretrain"
"$refit" export "$recipes/lora/pretrain-mlp.json" --set output.dir="$work/pretrain" --format merged --out "$work/pretrain/export"
"$refit" inspect "$recipes/lora/lora-bf16.json" --set models.0.weights="$work/pretrain/export/backbone.safetensors" \
  | tee "$work/inspect.txt"
grep -Eq "^backbone +21768 +0 +bfloat16" "$work/inspect.txt"
grep -Eq "^  \+ lora +4416 +4416 +float32" "$work/inspect.txt"
"$refit" train "$recipes/lora/lora-bf16.json" --set models.0.weights="$work/pretrain/export/backbone.safetensors" \
  --set output.dir="$work/lora" | tee "$work/lora.log" | grep -E "val @|done"
grep -Eq "val @ step 384: +accuracy 0\.[7-9]" "$work/lora.log" || { echo "FAIL: LoRA did not adapt the frozen model"; exit 1; }
"$python" "$learned" --ran --loss-falls --accuracy val accuracy data:val -- "$refit" train "$recipes/lora/lora-bf16.json" \
  --set models.0.weights="$work/pretrain/export/backbone.safetensors" --set output.dir="$work/lora"
"$refit" export "$recipes/lora/lora-bf16.json" --set models.0.weights="$work/pretrain/export/backbone.safetensors" \
  --set output.dir="$work/lora" --format peft --out "$work/peft"
grep -q '"peft_type": "LORA"' "$work/peft/adapter_config.json"
grep -q '"layers.2"' "$work/peft/adapter_config.json"
test -s "$work/peft/adapter_model.safetensors"
# Merged into the bf16 base: the registered dtype by default, float32 with --dtype float32.
for dtype in registered float32; do
  "$refit" export "$recipes/lora/lora-bf16.json" --set models.0.weights="$work/pretrain/export/backbone.safetensors" \
    --set output.dir="$work/lora" --format merged --out "$work/merged-$dtype" $([ $dtype = float32 ] && echo --dtype float32)
done
entry() { grep -ao '"layers.0.weight":{[^}]*}' "$1"; }  # the tensor's entry in the safetensors header
[[ $(entry "$work/merged-registered/backbone.safetensors") == *'"dtype":"BF16"'* ]]
[[ $(entry "$work/merged-float32/backbone.safetensors") == *'"dtype":"F32"'* ]]
echo "OK"
