#!/usr/bin/env bash
# Side by side, same machine, same invocation: refit's training loop vs Python eager PyTorch on
# the overhead-bound LoRA MLP step (one round; bench/compare.py runs alternating rounds).
# Usage: bench/run_mlp_overhead.sh [cpu|cuda] [steps]      (after scripts/build.sh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dev="${1:-cpu}"; steps="${2:-100}"
py="${PYTHON:-${REFIT_DEPS:-$HOME/.cache/refit}/torch-2.11.0/bin/python}"   # scripts/setup.sh's interpreter
[ -x "$py" ] || py=python3
build="${REFIT_BUILD_DIR:-$root/build}"
refit_json=$("$build/bench/bench_mlp_lora_overhead" "$dev" "$steps")
python_json=$("$py" "$root/bench/peer_mlp_lora.py" "$dev" "$steps" eager)
echo "$refit_json"
echo "$python_json"
"$py" - "$refit_json" "$python_json" <<'PY'
import json, sys
r, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"ratio (python / refit): {p['ms_per_step'] / r['ms_per_step']:.2f}x  "
      f"(refit {r['ms_per_step']:.2f} ms, python eager {p['ms_per_step']:.2f} ms, {r['device']})")
PY
