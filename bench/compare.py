"""Runs a refit benchmark and its Python peer alternately N times (same machine, same
invocation) and reports the median ms/step of each and the ratio of the medians.

  python bench/compare.py mlp [cpu|cuda] [rounds] [steps]   # overhead-bound LoRA MLP step
  python bench/compare.py vit [cpu|cuda] [rounds] [steps]   # the quickstart's ViT LoRA bf16 step
  python bench/compare.py minilm [cpu|cuda] [rounds] [steps]  # recipes/text/minilm-lora-bf16.json's step
                                                            # (REFIT_MINILM_DIR set: source scripts/env.sh)
  python bench/compare.py vitb cuda [rounds] [steps]        # ViT-B/14 224 px batch 128, frozen bf16 + LoRA r=16
                                                            # (peer: ../shared/anchors/anchor_vit_lora.py bf16_lora;
                                                            #  VITB_VARIANT=bf16_lora_compile for torch.compile)
  python bench/compare.py mlp-floor cuda [rounds] [steps]   # refit's graphed step vs Python's whole-step CUDA graph
                                                            # (anchor_mlp_floor.py graph)

REFIT_BENCH_GRAPH=1 runs refit's side with /training/cuda_graph on (mlp-floor sets it itself).
REFIT_BUILD_DIR overrides the build folder (build-gpu on the GPU machine)."""
import json, os, pathlib, statistics, subprocess, sys

root = pathlib.Path(__file__).resolve().parent.parent
which = sys.argv[1] if len(sys.argv) > 1 else "mlp"
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
steps = sys.argv[4] if len(sys.argv) > 4 else "50"
build = pathlib.Path(os.environ.get("REFIT_BUILD_DIR", root / "build"))
def anchor(name):
    path = root.parent / "shared/anchors" / name
    return path if path.exists() else root / ".device-deps" / name


if which == "mlp":
    refit_cmd = [str(build / "bench/bench_mlp_lora_overhead"), dev, steps]
    python_cmd = [sys.executable, str(anchor("anchor_mlp_overhead.py")), dev]
elif which == "mlp-floor":
    os.environ["REFIT_BENCH_GRAPH"] = "1"
    refit_cmd = [str(build / "bench/bench_mlp_lora_overhead"), dev, steps]
    # The anchor imports anchor_mlp_overhead from its own folder.
    python_cmd = [sys.executable, str(anchor("anchor_mlp_floor.py")), "graph"]
elif which == "vit":
    refit_cmd = [str(build / "bench/bench_vit_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = [sys.executable, str(root / "bench/peer_vit_lora.py"), dev, steps]
elif which == "minilm":
    refit_cmd = [str(build / "bench/bench_minilm_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = [sys.executable, str(root / "bench/peer_minilm_lora.py"), dev, steps]
elif which == "vitb":
    refit_cmd = [str(build / "bench/bench_vit_b14_lora"), dev, steps]
    python_cmd = [sys.executable, str(anchor("anchor_vit_lora.py")), os.environ.get("VITB_VARIANT", "bf16_lora")]
    os.environ["STEPS"] = steps  # the anchor reads STEPS (and B, default 128)
else:
    sys.exit("usage: compare.py mlp|mlp-floor|vit|minilm|vitb [cpu|cuda] [rounds] [steps]")


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    last = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in last:
        sys.exit(f"{cmd}: {last['error']}")
    return last


refit, python, peaks = [], [], {"refit": [], "python": []}
plan = None
for _ in range(rounds):
    a, b = run(refit_cmd), run(python_cmd)
    plan = a.get("cuda_graph", plan)
    refit.append(a["ms_per_step"])
    python.append(b["ms_per_step"])
    if "peak_gib" in a and "peak_gib" in b:
        peaks["refit"].append(a["peak_gib"])
        peaks["python"].append(b["peak_gib"])
r, p = statistics.median(refit), statistics.median(python)
# Each round runs the two back to back: the ratio within a round holds when the machine's speed
# drifts between rounds, so the median of those ratios is quoted beside the ratio of medians.
pair = statistics.median(b / a for a, b in zip(refit, python))
print(json.dumps({"benchmark": which, "device": dev, "rounds": rounds, "refit_ms": refit, "python_ms": python,
                  **({"peak_gib": peaks} if peaks["refit"] else {})}))
print(f"{which} on {dev}: median ms/step refit {r:.2f}, python {p:.2f}; ratio python/refit {p / r:.2f}x "
      f"(median of per-round ratios {pair:.2f}x)")
if plan:
    print(f"refit cuda graph: {plan}")
if peaks["refit"]:
    print(f"peak memory: refit {max(peaks['refit']):.2f} GiB, python {max(peaks['python']):.2f} GiB")
