#!/usr/bin/env bash
# Side by side, same machine, same invocation: refit's training loop vs Python eager PyTorch on
# the overhead-bound LoRA MLP step. Usage: bench/run_mlp_overhead.sh [cpu|cuda] [steps]
# Needs the Python peer: ../shared/anchors/anchor_mlp_overhead.py (or .device-deps/ on the GPU machine).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dev="${1:-cpu}"; steps="${2:-100}"
py="${PYTHON:-$HOME/.cache/refit/torch-2.11.0/bin/python}"
[ -x "$py" ] || py=python3                       # the GPU machine: its own python3 with torch
build="${REFIT_BUILD_DIR:-$root/build}"           # gpu-check.sh builds in build-gpu
anchor="$root/../shared/anchors/anchor_mlp_overhead.py"
[ -f "$anchor" ] || anchor="$root/.device-deps/anchor_mlp_overhead.py"
refit_json=$("$build/bench/bench_mlp_lora_overhead" "$dev" "$steps")
python_json=$("$py" "$anchor" "$dev" 2>/dev/null)
echo "$refit_json"
echo "$python_json"
"$py" - "$refit_json" "$python_json" <<'PY'
import json, sys
r, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"ratio (python / refit): {p['ms_per_step'] / r['ms_per_step']:.2f}x  "
      f"(refit {r['ms_per_step']:.2f} ms, python eager {p['ms_per_step']:.2f} ms, {r['device']})")
PY
