#!/usr/bin/env python3
"""Encode throughput of refit's byte-level BPE tokenizer vs Hugging Face `tokenizers`, same machine,
same invocation, same texts: every fortune record of Debian's `fortunes` (as
tests/golden/make_byte_bpe.py reads them) with SmolLM2's tokenizer from its GGUF file.

    source scripts/env.sh    # REFIT_SMOLLM2_GGUF
    ~/.cache/refit/torch-2.11.0/bin/python bench/tokenizer_throughput.py [passes] [rounds]

Single thread: refit's encode() in a loop vs tokenizers' encode_batch with RAYON_NUM_THREADS=1 (one
call into Rust: no Python per text) - and, for scale, tokenizers' encode() per text from Python.
Batch: refit with one thread per core over contiguous parts vs encode_batch on all cores. Each side
runs in its own process, alternately `rounds` times; each reports its best of `passes` passes
after one untimed pass (both keep a word cache), single-threaded passes also in process CPU time
(on a shared machine wall time counts the other processes' turns). Prints MB/s (UTF-8 bytes of input per second), the
ratio of the medians over rounds, and the CPU. REFIT_BUILD_DIR: the build folder (default build/).
"""
import glob
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

root = pathlib.Path(__file__).resolve().parent.parent
build = pathlib.Path(os.environ.get("REFIT_BUILD_DIR", root / "build"))
FORTUNES = "/usr/share/games/fortunes"


def fortunes():
    out = []
    for path in sorted(glob.glob(os.path.join(FORTUNES, "*.u8"))):
        data = pathlib.Path(path).read_bytes().decode("utf-8", errors="replace")
        out += [r.strip("\n") for r in data.split("\n%\n") if r.strip("\n")]
    return out


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


PEER = r"""
import json, os, sys, time
texts = json.load(open(sys.argv[1])); passes = int(sys.argv[2]); mode = sys.argv[3]
from transformers import AutoTokenizer
p = os.environ["REFIT_SMOLLM2_GGUF"]
tok = AutoTokenizer.from_pretrained(os.path.dirname(p), gguf_file=os.path.basename(p)).backend_tokenizer
mb = sum(len(t.encode()) for t in texts) / 1e6
run = (lambda: tok.encode_batch(texts)) if mode != "loop" else (lambda: [tok.encode(t) for t in texts])
run()
best = best_cpu = 1e30
for _ in range(passes):
    t0, c0 = time.perf_counter(), time.process_time(); run()
    best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
print(json.dumps({"impl": "tokenizers", "mode": mode, "mb_per_s": round(mb / best, 2), "cpu_mb_per_s": round(mb / best_cpu, 2)}))
"""


def main():
    passes = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    gguf = os.environ.get("REFIT_SMOLLM2_GGUF")
    if not gguf:
        sys.exit("REFIT_SMOLLM2_GGUF is not set: source scripts/env.sh")
    binary = build / "bench" / "bench_tokenizer_throughput"
    if not binary.exists():
        sys.exit(f"{binary} is missing: cmake --build {build} --target bench_tokenizer_throughput")
    texts = fortunes()
    threads = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "texts.json")
        json.dump(texts, open(path, "w"))
        results = {"refit single": [], "refit single (CPU time)": [], "refit batch": [], "tokenizers single": [],
                   "tokenizers single (CPU time)": [], "tokenizers batch": [], "tokenizers per-text loop": []}
        for _ in range(rounds):
            r = json.loads(subprocess.run([str(binary), gguf, path, str(passes), str(threads)], check=True,
                                          capture_output=True, text=True).stdout)
            results["refit single"].append(r["single_mb_per_s"])
            results["refit single (CPU time)"].append(r["single_cpu_mb_per_s"])
            results["refit batch"].append(r["batch_mb_per_s"])
            for mode, env, key in [("batch", {"RAYON_NUM_THREADS": "1"}, "tokenizers single"),
                                   ("batch", {}, "tokenizers batch"), ("loop", {"RAYON_NUM_THREADS": "1"},
                                                                       "tokenizers per-text loop")]:
                out = subprocess.run([sys.executable, "-c", PEER, path, str(passes), mode], check=True,
                                     capture_output=True, text=True, env={**os.environ, **env}).stdout
                peer = json.loads(out.strip().splitlines()[-1])
                results[key].append(peer["mb_per_s"])
                if key == "tokenizers single":
                    results["tokenizers single (CPU time)"].append(peer["cpu_mb_per_s"])
    med = {k: statistics.median(v) for k, v in results.items()}
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"CPU: {cpu_name()} ({threads} threads)")
    print(f"texts: {len(texts)} fortune records, {mb:.2f} MB UTF-8; {rounds} rounds x best of {passes} passes; "
          f"medians over rounds")
    for k, v in med.items():
        print(f"  {k:26s} {v:8.2f} MB/s   (rounds: {', '.join(f'{x:.2f}' for x in results[k])})")
    print(f"ratio single-thread (refit / tokenizers encode_batch, 1 thread): {med['refit single'] / med['tokenizers single']:.2f}x")
    print(f"ratio single-thread in process CPU time:                         "
          f"{med['refit single (CPU time)'] / med['tokenizers single (CPU time)']:.2f}x")
    print(f"ratio batch ({threads} threads):                                  {med['refit batch'] / med['tokenizers batch']:.2f}x")
    print(f"ratio vs tokenizers' per-text encode() from Python:              {med['refit single'] / med['tokenizers per-text loop']:.2f}x")


if __name__ == "__main__":
    main()
