"""Runs a refit benchmark and its Python peer (bench/peer_*.py) alternately N times (same
machine, same invocation) and reports the median ms/step of each and the ratio of the medians.

  python bench/compare.py mlp [cpu|cuda] [rounds] [steps]     # overhead-bound LoRA MLP step (peer_mlp_lora.py)
  python bench/compare.py vit [cpu|cuda] [rounds] [steps]     # the quickstart's ViT LoRA bf16 step (peer_vit_lora.py)
  python bench/compare.py minilm [cpu|cuda] [rounds] [steps]  # recipes/text/minilm-lora-bf16.json's step
                                                              # (peer_minilm_lora.py; REFIT_MINILM_DIR: source scripts/env.sh)
  python bench/compare.py minilm-qlora [cpu|cuda] [rounds] [steps] # that step with the base in NF4: refit's "dtype":
                                                              # "nf4" vs PEFT on bitsandbytes' Linear4bit
  python bench/compare.py minilm-nf4 [cpu|cuda] [rounds] [steps] # refit's MiniLM step, bf16 base then NF4 base
  python bench/compare.py smollm2 [cpu|cuda] [rounds] [steps] # recipes/llm/smollm2-wordnet-lora.json's step
                                                              # (peer_smollm2_lora.py, transformers + PEFT on the same
                                                              #  GGUF; REFIT_BENCH_NF4=1: refit's base in NF4)
  python bench/compare.py smollm2-nf4 [cpu|cuda] [rounds] [steps] # that step with refit's base in bf16, then in NF4
  python bench/compare.py smollm2-gguf [cpu|cuda] [rounds] [steps] # bf16, then the GGUF's Q4_1 blocks ("dtype": "gguf")
                                                              # (the QLoRA cost; both columns are refit's)
  python bench/compare.py smollm2-generate [cpu|cuda] [rounds] [bf16|fp32] # refit generate vs transformers' generate:
                                                              # 8 prompts, one batch, greedy, 32 new tokens
                                                              # (refit_generate_smollm2.py, peer_smollm2_generate.py);
                                                              # ms per generated token
  python bench/compare.py smollm2-llamacpp cpu [rounds] [bf16|fp32] # refit generate vs llama.cpp (llama-cpp-python)
                                                              # on the same GGUF's Q4_1 blocks, the prompts one by one
                                                              # (peer_smollm2_llamacpp.py); ms per generated token
  python bench/compare.py vitb [cuda|cpu] [rounds] [steps]    # ViT-B/14 224 px batch 128, frozen bf16 + LoRA r=16
                                                              # (peer_vit_b14_lora.py, timm + PEFT; VITB_VARIANT=compile
                                                              #  for torch.compile; VITB_BATCH, VITB_IMAGE: smaller sizes,
                                                              #  e.g. a CPU smoke run VITB_BATCH=2 VITB_IMAGE=56)
  python bench/compare.py mlp-floor cuda [rounds] [steps]     # refit's graphed step vs Python's whole-step CUDA graph
                                                              # (peer_mlp_lora.py graph)
  python bench/compare.py predict [cpu|cuda] [rounds]         # refit predict on the quickstart's 5000 test images vs a
                                                              # PyTorch + PEFT loop writing the same JSON lines
                                                              # (refit_predict_vit.py, peer_predict_vit.py); ms per batch of 64

REFIT_BENCH_GRAPH=1 runs refit's side with /training/cuda_graph on (mlp-floor sets it itself).
REFIT_BENCH_CHECKPOINTING=1 runs minilm with gradient checkpointing on both sides.
REFIT_BUILD_DIR overrides the build folder (default build/; bench/gpu_run.sh uses build-gpu)."""
import json, os, pathlib, statistics, subprocess, sys

root = pathlib.Path(__file__).resolve().parent.parent
which = sys.argv[1] if len(sys.argv) > 1 else "mlp"
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
steps = sys.argv[4] if len(sys.argv) > 4 else "50"
build = pathlib.Path(os.environ.get("REFIT_BUILD_DIR", root / "build"))
peer = lambda name: str(root / "bench" / name)
labels = ("refit", "python")  # the two columns: refit's command, then its peer's


if which == "mlp":
    refit_cmd = [str(build / "bench/bench_mlp_lora_overhead"), dev, steps]
    python_cmd = [sys.executable, peer("peer_mlp_lora.py"), dev, steps, "eager"]
elif which == "mlp-floor":
    os.environ["REFIT_BENCH_GRAPH"] = "1"
    refit_cmd = [str(build / "bench/bench_mlp_lora_overhead"), dev, steps]
    python_cmd = [sys.executable, peer("peer_mlp_lora.py"), dev, steps, "graph"]
elif which == "vit":
    refit_cmd = [str(build / "bench/bench_vit_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = [sys.executable, peer("peer_vit_lora.py"), dev, steps]
elif which == "minilm":
    refit_cmd = [str(build / "bench/bench_minilm_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = [sys.executable, peer("peer_minilm_lora.py"), dev, steps]
elif which == "minilm-qlora":
    refit_cmd = ["env", "REFIT_BENCH_NF4=1", str(build / "bench/bench_minilm_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = ["env", "REFIT_BENCH_NF4=1", sys.executable, peer("peer_minilm_lora.py"), dev, steps]
elif which == "minilm-nf4":
    labels = ("refit bf16 base", "refit NF4 base")
    refit_cmd = [str(build / "bench/bench_minilm_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = ["env", "REFIT_BENCH_NF4=1", *refit_cmd]
elif which == "smollm2":
    refit_cmd = [str(build / "bench/bench_smollm2_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = [sys.executable, peer("peer_smollm2_lora.py"), dev, steps]
elif which == "smollm2-nf4":
    labels = ("refit bf16 base", "refit NF4 base")
    refit_cmd = [str(build / "bench/bench_smollm2_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = ["env", "REFIT_BENCH_NF4=1", *refit_cmd]
elif which == "smollm2-gguf":
    labels = ("refit bf16 base", "refit GGUF-block base")
    refit_cmd = [str(build / "bench/bench_smollm2_lora_step"), str(root / "recipes"), dev, steps]
    python_cmd = ["env", "REFIT_BENCH_GGUF=1", *refit_cmd]
elif which == "smollm2-generate":
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bf16"
    refit_cmd = [sys.executable, peer("refit_generate_smollm2.py"), str(build), dev, dtype]
    python_cmd = [sys.executable, peer("peer_smollm2_generate.py"), dev, dtype]
elif which == "smollm2-llamacpp":
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bf16"
    refit_cmd = [sys.executable, peer("refit_generate_smollm2.py"), str(build), dev, dtype]
    python_cmd = [sys.executable, peer("peer_smollm2_llamacpp.py")]
elif which == "vitb":
    size = [os.environ.get("VITB_BATCH", "128"), os.environ.get("VITB_IMAGE", "224")]
    refit_cmd = [str(build / "bench/bench_vit_b14_lora"), dev, steps, *size]
    python_cmd = [sys.executable, peer("peer_vit_b14_lora.py"), dev, steps, *size, os.environ.get("VITB_VARIANT", "eager")]
elif which == "predict":
    refit_cmd = [sys.executable, peer("refit_predict_vit.py"), str(build), dev]
    python_cmd = [sys.executable, peer("peer_predict_vit.py"), dev]
else:
    sys.exit("usage: compare.py mlp|mlp-floor|vit|minilm|minilm-qlora|minilm-nf4|smollm2|smollm2-nf4|smollm2-gguf|smollm2-generate|smollm2-llamacpp|vitb|predict [cpu|cuda] [rounds] [steps]")


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    last = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in last:
        sys.exit(f"{cmd}: {last['error']}")
    return last


refit, python, peaks = [], [], {"refit": [], "python": []}
plan = bf16 = None
for _ in range(rounds):
    a, b = run(refit_cmd), run(python_cmd)
    plan = a.get("cuda_graph", plan)
    bf16 = a.get("cpu_bf16_products", bf16)
    refit.append(a["ms_per_step"])
    python.append(b["ms_per_step"])
    if "peak_gib" in a and "peak_gib" in b:
        peaks["refit"].append(a["peak_gib"])
        peaks["python"].append(b["peak_gib"])
r, p = statistics.median(refit), statistics.median(python)
# Each round runs the two back to back: the ratio within a round holds when the machine's speed
# drifts between rounds, so the median of those ratios is quoted beside the ratio of medians.
pair = statistics.median(b / a for a, b in zip(refit, python))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
flags = set(next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), []))
isa = "+".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
emulated = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ}
print(json.dumps({"benchmark": which, "device": dev, "rounds": rounds, "cpu": cpu, "cpu_flags": isa,
                  "emulation": emulated, "refit_cpu_bf16_products": bf16, "refit_ms": refit, "python_ms": python,
                  **({"peak_gib": peaks} if peaks["refit"] else {})}))
print(f"{which} on {dev}: median ms/step {labels[0]} {r:.2f}, {labels[1]} {p:.2f}; ratio {labels[1]}/{labels[0]} "
      f"{p / r:.2f}x (median of per-round ratios {pair:.2f}x)")
if plan:
    print(f"refit cuda graph: {plan}")
if peaks["refit"]:
    print(f"peak memory: refit {max(peaks['refit']):.2f} GiB, python {max(peaks['python']):.2f} GiB")
