#!/usr/bin/env python3
"""The golden tests' bounds against what they measure: docs/precision.md's table.

Every golden check (tests/unit/numeric_bounds.h, check_bound_ratio) logs its measured error over
its derived bound when REFIT_BOUNDS_LOG names a file. This script runs the golden tests

  native   on this CPU as it is,
  avx2     under the AVX2 emulation (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2: other
           kernels, other summation orders), and
  mutants  with the nearest planted bug of each (scripts/mutants/*.patch, applied to the tree
           in turn, built, run, reverted),

and prints, per golden test, the bound's kind, the largest error / bound measured (how close the
bound comes: it must stay <= 1 everywhere, and the bound be no more than ~30 times the error, a
ratio >= 1/30), the smallest (the loosest quantity), and the nearest mutant's largest error /
bound (> 1: the bound sees it). A full table per quantity goes to build/bounds/quantities.md.

  scripts/golden_bounds.py [--skip-runs] [--only native,avx2,mutants] [--mutant ID ...]

Not part of ctest (10 minutes on a 2-core Intel Xeon with a warm ccache: 17 mutants rebuild). Logs: build/bounds/.
Standard library only.
"""
import argparse
import collections
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "build", "bounds")
MUTANTS = os.path.join(HERE, "mutants")
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

# Each golden test (a regex on its name, without the "unit:" prefix), the kind of its bound, and
# its nearest planted bug (a patch in scripts/mutants/): the smallest plausible mistake in what
# the test is named for.
GOLDEN = [
    ("vit matches transformers' Dinov2Model", "probabilistic, first order; fp64 vs transformers' fp64", "04"),
    ("vit with register tokens", "probabilistic, first order; fp64 vs transformers' fp64", "01"),
    ("vit: PEFT's adapter from transformers", "probabilistic, first order", "08"),
    ("vit: refit writes a PEFT adapter", "probabilistic, first order", "08"),
    ("bert: all-MiniLM-L6-v2 matches", "probabilistic, first order", "39"),
    ("bert: refit writes a MiniLM LoRA adapter", "probabilistic, first order", "08"),
    ("bert: QLoRA on all-MiniLM-L6-v2", "probabilistic, first order; vs fp64 on the NF4 values", "48"),
    ("predict: MiniLM embeddings \\(", "probabilistic, first order; each vs fp64", "39"),
    ("predict: MiniLM embeddings of long inputs", "probabilistic, first order; each vs fp64", "39"),
    ("dino: the DINO head's forward", "probabilistic, first order", "40"),
    ("dino: loss, gradients, centre", "probabilistic, first order", "38"),
    ("LoRA on Linear: a PEFT adapter", "probabilistic, P(|inputs|) per element", "08"),
    ("rsLoRA on Conv2d", "probabilistic, P(|inputs|) per element", "08"),
    ("LoRA on a dilated Conv2d", "probabilistic, P(|inputs|) per element", "08"),
    ("refit writes PEFT files that PEFT loads", "probabilistic, P(|inputs|) per element", "08"),
    ("LoRA combinations on Linear", "P per element; svd: Wedin", "41"),
    ("LoRA combinations on Conv2d", "P per element; svd: Wedin", "41"),
    ("DoRA on Linear", "probabilistic, P(|inputs|) per element", "10"),
    ("DoRA on Conv2d", "probabilistic, P(|inputs|) per element", "52"),
    ("DoRA: refit writes PEFT files", "probabilistic, P(|inputs|) per element", "52"),
    ("50 steps of AdamW", "probabilistic, first order; sensitivities by autograd", "12"),
    ("accumulated micro-batches, partial", "probabilistic, first order; sensitivities by autograd", "17"),
    ("fused AdamW takes found_inf", "worst case, first order, per step", "42"),
    ("llama: a tiny Llama", "probabilistic, first order; fp64 vs transformers' fp64", "29"),
    ("llama: a tiny Qwen2", "probabilistic, first order; fp64 vs transformers' fp64", "29"),
    ("llama: decoding with the KV cache", "probabilistic, first order; each path vs fp64", "28"),
    ("llama: SmolLM2-135M from its GGUF", "probabilistic, first order (x2)", "26"),
    ("llama: refit's SmolLM2 LoRA adapter", "probabilistic, first order (x2)", "08"),
    ("chunked cross-entropy: loss and gradients", "worst case, P per element", "31"),
]


def selection(names):
    return "^unit: ?(" + "|".join(names) + ")"


def run(cmd, env=None, check=True):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})})
    if check and r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}")
    return r.returncode


def ctest(log, names, env=None):
    if os.path.exists(log):
        os.remove(log)
    return run(["ctest", "--preset", "cases", "-j2", "-R", selection(names)],
               env={**(env or {}), "REFIT_BOUNDS_LOG": log}, check=False)


def build():
    run(["cmake", "--build", "--preset", "default"])


def run_mutant(mid):
    patch = next(os.path.join(MUTANTS, p) for p in os.listdir(MUTANTS) if p.startswith(mid + "-") and p.endswith(".patch"))
    names = [g[0] for g in GOLDEN if g[2] == mid]
    run(["git", "apply", "--check", patch])
    run(["git", "apply", patch])
    try:
        build()
        ctest(os.path.join(OUT, f"mutant-{mid}.tsv"), names)
    finally:
        run(["git", "apply", "-R", patch])
    build()


def read(log):
    """{(test, label): largest ratio} from a log."""
    ratios = {}
    if not os.path.exists(log):
        return ratios
    with open(log) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                continue
            key = (parts[0], parts[1])
            ratios[key] = max(ratios.get(key, 0.0), float(parts[2]))
    return ratios


def test_of(name):
    for i, (regex, _, _) in enumerate(GOLDEN):
        if re.match(regex, name):
            return i
    return None


def fmt(x):
    if x is None:
        return "—"
    if x == 0:
        return "0"
    return f"{x:.3g}"


def tables():
    native, avx2 = read(os.path.join(OUT, "native.tsv")), read(os.path.join(OUT, "avx2.tsv"))
    per_test = collections.defaultdict(lambda: {"native": [], "avx2": [], "mutant": []})
    rows = []
    for (test, label), r in sorted(native.items()):
        i = test_of(test)
        if i is None:
            continue
        a = avx2.get((test, label))
        per_test[i]["native"].append(r)
        if a is not None:
            per_test[i]["avx2"].append(a)
        rows.append((GOLDEN[i][0].replace("\\", ""), label, r, a))
    for i, (_, _, mid) in enumerate(GOLDEN):
        m = read(os.path.join(OUT, f"mutant-{mid}.tsv"))
        per_test[i]["mutant"] = [r for (test, _), r in m.items() if test_of(test) == i]
    out = ["| golden test | bound | largest error / bound: native, AVX2 | loosest quantity: native, AVX2 "
           "| nearest mutant | its error / bound |", "|---|---|---|---|---|---|"]
    for i, (regex, kind, mid) in enumerate(GOLDEN):
        t = per_test[i]
        if not t["native"]:
            continue
        nz = lambda xs: [x for x in xs if x > 0] or [0.0]
        name = regex.replace(chr(92), "").removesuffix(" (")
        out.append(f"| {name} | {kind.replace('|', chr(92) + '|')} | {fmt(max(t['native']))}, "
                   f"{fmt(max(t['avx2'])) if t['avx2'] else '—'} | {fmt(min(nz(t['native'])))}, "
                   f"{fmt(min(nz(t['avx2']))) if t['avx2'] else '—'} | {mid} | "
                   f"{fmt(max(t['mutant'])) if t['mutant'] else 'not run'} |")
    full = ["| golden test | quantity | error / bound native | AVX2 |", "|---|---|---|---|"]
    full += [f"| {t} | {q} | {fmt(n)} | {fmt(a)} |" for t, q, n, a in rows]
    return "\n".join(out), "\n".join(full)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-runs", action="store_true", help="only build the tables from build/bounds/")
    ap.add_argument("--only", default="native,avx2,mutants", help="which runs (comma-separated)")
    ap.add_argument("--mutant", action="append", default=[], help="run only this mutant id (repeatable)")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    only = set(args.only.split(","))
    if not args.skip_runs:
        if subprocess.run(["git", "diff", "--quiet"], cwd=ROOT).returncode != 0 and "mutants" in only:
            sys.exit("the working tree has uncommitted changes: commit them before the mutant runs")
        build()
        names = [g[0] for g in GOLDEN]
        if "native" in only:
            ctest(os.path.join(OUT, "native.tsv"), names)
        if "avx2" in only:
            ctest(os.path.join(OUT, "avx2.tsv"), names, AVX2)
        if "mutants" in only:
            for mid in dict.fromkeys(g[2] for g in GOLDEN):
                if not args.mutant or mid in args.mutant:
                    run_mutant(mid)
    summary, full = tables()
    with open(os.path.join(OUT, "quantities.md"), "w") as f:
        f.write(full + "\n")
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    print(f"\nCPU: {cpu}\n\n{summary}\n\n(per quantity: {os.path.join(OUT, 'quantities.md')})")


if __name__ == "__main__":
    main()
