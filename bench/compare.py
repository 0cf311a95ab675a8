"""Runs a refit benchmark and its Python peer alternately N times (same machine, same
invocation) and reports the median ms/step of each and the ratio of the medians.

  python bench/compare.py mlp [cpu|cuda] [rounds] [steps]   # overhead-bound LoRA MLP step
  python bench/compare.py vit [cpu|cuda] [rounds] [steps]   # the quickstart's ViT LoRA bf16 step

REFIT_BUILD_DIR overrides the build folder (build-gpu on the GPU machine)."""
import json, os, pathlib, statistics, subprocess, sys

root = pathlib.Path(__file__).resolve().parent.parent
which = sys.argv[1] if len(sys.argv) > 1 else "mlp"
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
steps = sys.argv[4] if len(sys.argv) > 4 else "50"
build = pathlib.Path(os.environ.get("REFIT_BUILD_DIR", root / "build"))
if which == "mlp":
    anchor = root.parent / "shared/anchors/anchor_mlp_overhead.py"
    if not anchor.exists():
        anchor = root / ".device-deps/anchor_mlp_overhead.py"
    refit_cmd = [str(build / "bench/bench_mlp_lora_overhead"), dev, steps]
    python_cmd = [sys.executable, str(anchor), dev]
elif which == "vit":
    refit_cmd = [str(build / "bench/bench_vit_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = [sys.executable, str(root / "bench/peer_vit_lora.py"), dev, steps]
else:
    sys.exit("usage: compare.py mlp|vit [cpu|cuda] [rounds] [steps]")


def ms(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ms_per_step"]


refit, python = [], []
for _ in range(rounds):
    refit.append(ms(refit_cmd))
    python.append(ms(python_cmd))
r, p = statistics.median(refit), statistics.median(python)
print(json.dumps({"benchmark": which, "device": dev, "rounds": rounds, "refit_ms": refit, "python_ms": python}))
print(f"{which} on {dev}: median ms/step refit {r:.2f}, python {p:.2f}; ratio python/refit {p / r:.2f}x")
