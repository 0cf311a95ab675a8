#!/usr/bin/env python3
"""Activation memory and step time with and without gradient checkpointing
(/models/<i>/gradient_checkpointing), from `refit train`'s own measurement (summary.json's
memory.measured, docs/performance.md "Memory by component").

  python3 bench/checkpointing_memory.py [REFIT] [--device cpu|cuda] [--steps N]

Runs, each with and without recomputation of the backbone's blocks:
  * the quickstart (LoRA in a frozen bf16 ViT, bf16-mixed), batch 256;
  * all-MiniLM-L6-v2 with LoRA (frozen bf16 BERT, bf16-mixed), batch 64, texts cut at 128 tokens.
Prints one row per run: activations (the largest step's allocator peak above its start), the
other components, and the mean step time after the first step; then the ratios.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

CASES = [
    ("quickstart ViT, batch 256", "recipes/quickstart.json",
     ["training.batch_size=256", "training.gradient_accumulation=1"]),
    ("MiniLM LoRA, batch 64, up to 128 tokens", "recipes/text/minilm-lora-bf16.json",
     ["training.batch_size=64", "training.gradient_accumulation=1", "data.train.config.max_length=128"]),
]


def train(refit, recipe, overrides, out):
    args = [refit, "train", str(ROOT / recipe), "--set", f"output.dir={out}"]
    for o in overrides:
        args += ["--set", o]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((pathlib.Path(out) / "summary.json").read_text())
    times = [json.loads(line) for line in (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines()]
    times = [t["time"] for t in times if t.get("kind") == "train"]
    step = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
    return summary["memory"]["measured"], step


def main():
    p = argparse.ArgumentParser()
    p.add_argument("refit", nargs="?", default=str(ROOT / "scripts/refit"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    mib = lambda b: f"{b / 2**20:8.1f}"
    print(f"device {a.device}, {a.steps} steps per run; MiB; step time in ms (after the first step)")
    print(f"{'run':40s} {'ckpt':>5s} {'activ.':>8s} {'frozen':>8s} {'train.':>8s} {'grads':>8s} {'optim':>8s} {'step ms':>9s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, recipe, overrides in CASES:
            results = {}
            for ckpt in (False, True):
                o = overrides + [f"training.device={a.device}", f"training.duration={a.steps}:step",
                                 "training.log_every=1", "output.checkpoints.enabled=false",
                                 f"models.0.gradient_checkpointing={'true' if ckpt else 'false'}"]
                m, step = train(a.refit, recipe, o, os.path.join(tmp, f"{len(results)}-{name[:4]}"))
                results[ckpt] = (m, step)
                print(f"{name:40s} {'on' if ckpt else 'off':>5s} {mib(m.get('activations', 0))} {mib(m['frozen_weights'])} "
                      f"{mib(m['trainable_weights'])} {mib(m['gradients'])} {mib(m['optimizer_state'])} {step * 1e3:9.1f}")
            (off, t_off), (on, t_on) = results[False], results[True]
            print(f"{'':40s} activations x{on.get('activations', 0) / max(1, off.get('activations', 1)):.2f}, "
                  f"step time x{t_on / t_off:.2f}")


if __name__ == "__main__":
    sys.exit(main())
