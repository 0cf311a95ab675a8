"""How CPU bf16 products are computed, measured on a recipe: `refit train` in alternating rounds
with each way of computing them (docs/precision.md, "bf16 products on the CPU"), samples/s of
each, and the ratios. One invocation, same machine, same build.

  python bench/bf16_routing.py RECIPE STEPS [ROUNDS] [--avx2] [--fp32-model I ...] [--variants a,b] [-- --set k=v ...]

Variants, each once per round in turn:
  auto         the default: per product shape, the faster side, timed on first use (its store
               in a fresh folder for this invocation: the first round times, later rounds read)
  native       REFIT_BF16_PRODUCTS=native: LibTorch's bf16 kernels for every product
  fp32-route   REFIT_BF16_PRODUCTS=fp32: every bf16 product through fp32 kernels, rounded
  fp32-recipe  the same recipe in fp32: /training/precision fp32 and every model given by
               --fp32-model (default 0) stored in float32
--variants keeps auto and the variants named (LibTorch's scalar bf16 under --avx2 is ~10-20x
slower than the rest: time it in a run of its own). --avx2 runs every variant under the AVX2-only emulation (ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2). Throughput is training samples over training time between the
updates after the first `WARMUP` (5) ones, leaving out intervals that hold an evaluation."""
import json, os, pathlib, statistics, subprocess, sys, tempfile

root = pathlib.Path(__file__).resolve().parent.parent
build = pathlib.Path(os.environ.get("REFIT_BUILD_DIR", root / "build"))
WARMUP = int(os.environ.get("WARMUP", "5"))

args = sys.argv[1:]
extra = []
if "--" in args:
    extra = args[args.index("--") + 1:]
    args = args[: args.index("--")]
avx2 = "--avx2" in args
args = [a for a in args if a != "--avx2"]
only = None
if "--variants" in args:
    i = args.index("--variants")
    only = args[i + 1].split(",")
    del args[i : i + 2]
fp32_models = []
while "--fp32-model" in args:
    i = args.index("--fp32-model")
    fp32_models.append(args[i + 1])
    del args[i : i + 2]
if len(args) < 2:
    sys.exit(__doc__)
recipe, steps = args[0], int(args[1])
rounds = int(args[2]) if len(args) > 2 else 3
fp32_models = fp32_models or ["0"]

work = pathlib.Path(tempfile.mkdtemp(prefix="refit-bf16-routing-"))
base_env = dict(os.environ)
if avx2:
    base_env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
base_env["REFIT_BF16_PRODUCTS_CACHE"] = str(work / "store")

variants = {
    "auto": ({}, []),
    "native": ({"REFIT_BF16_PRODUCTS": "native"}, []),
    "fp32-route": ({"REFIT_BF16_PRODUCTS": "fp32"}, []),
    "fp32-recipe": ({}, ["--set", "training.precision=fp32"]
                    + [a for m in fp32_models for a in ("--set", f"models.{m}.dtype=float32")]),
}


if only:
    variants = {n: v for n, v in variants.items() if n in only or n == "auto"}


def throughput(metrics):
    lines = [json.loads(l) for l in metrics.read_text().splitlines() if l.strip()]
    samples = seconds = 0.0
    prev = None
    seen = 0
    for l in lines:
        if l.get("kind") != "train":
            prev = None  # an evaluation between two updates: that interval is not training
            continue
        seen += 1
        if prev is not None and seen > WARMUP + 1:
            samples += l["samples"] - prev["samples"]
            seconds += l["time"] - prev["time"]
        prev = l
    if seconds <= 0:
        sys.exit(f"{metrics}: too few updates after the first {WARMUP} to measure")
    return samples / seconds


def run(name, round_):
    env_add, sets = variants[name]
    out = work / f"{name}-{round_}"
    cmd = [str(build / "refit"), "train", str(root / "recipes" / recipe), "--set", f"training.duration={steps}:step",
           "--set", f"output.dir={out}", "--set", "training.log_every=1", *sets, *extra]
    env = dict(base_env, **env_add)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{name}: {' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    decision = next((l for l in p.stdout.splitlines() if l.startswith("CPU bf16 products")), "")
    shapes = next((l for l in p.stdout.splitlines() if l.startswith("CPU bf16 products by shape")), "")
    return throughput(out / "metrics.jsonl"), decision, shapes


cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "").split()
bf16_flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
print(f"CPU: {cpu}, {os.cpu_count()} cores, flags {' '.join(bf16_flags)}"
      + (", AVX2 emulation (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)" if avx2 else ""))
print(f"recipe {recipe}, {steps} steps, {rounds} rounds, extra {' '.join(extra) or '-'}")
rates = {name: [] for name in variants}
for r in range(rounds):
    for name in variants:
        rate, decision, shapes = run(name, r)
        rates[name].append(rate)
        print(f"  round {r + 1} {name:12s} {rate:8.1f} samples/s   {decision}", flush=True)
        if shapes and r == 0:
            print(f"  {'':20s}{shapes}")
med = {name: statistics.median(v) for name, v in rates.items()}
print("median samples/s: " + ", ".join(f"{n} {v:.1f}" for n, v in med.items()))
# Step-time ratios auto / X = rate(X) / rate(auto): below 1, auto is the faster. Issue 36's bars:
# auto within 1.3x of the fp32 recipe, and within 1.05x of either forced side.
print("auto step time / " + ", ".join(f"{n} {med[n] / med['auto']:.2f}x" for n in variants if n != "auto"))
print("per round: " + "; ".join(f"{n} " + " ".join(f"{rates[n][r] / rates['auto'][r]:.2f}x" for r in range(rounds))
                                for n in variants if n != "auto"))
