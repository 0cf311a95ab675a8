"""Runs the refit benchmark and the Python peer alternately N times and reports the median
ms/step of each and the ratio of the medians (one machine, one invocation).
Usage: python bench/compare_mlp_overhead.py [cpu|cuda] [rounds] [steps]"""
import json, os, pathlib, statistics, subprocess, sys

root = pathlib.Path(__file__).resolve().parent.parent
dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
steps = sys.argv[3] if len(sys.argv) > 3 else "50"
anchor = root.parent / "shared/anchors/anchor_mlp_overhead.py"
if not anchor.exists():
    anchor = root / ".device-deps/anchor_mlp_overhead.py"
refit, python = [], []
for _ in range(rounds):
    build = pathlib.Path(os.environ.get("REFIT_BUILD_DIR", root / "build"))
    out = subprocess.run([str(build / "bench/bench_mlp_lora_overhead"), dev, steps], capture_output=True, text=True, check=True)
    refit.append(json.loads(out.stdout.strip().splitlines()[-1])["ms_per_step"])
    out = subprocess.run([sys.executable, str(anchor), dev], capture_output=True, text=True, check=True)
    python.append(json.loads(out.stdout.strip().splitlines()[-1])["ms_per_step"])
r, p = statistics.median(refit), statistics.median(python)
print(json.dumps({"device": dev, "rounds": rounds, "refit_ms": refit, "python_eager_ms": python}))
print(f"median ms/step: refit {r:.2f}, python eager {p:.2f}; ratio python/refit {p / r:.2f}x")
