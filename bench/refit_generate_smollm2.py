"""refit's side of bench/compare.py smollm2-generate: `refit generate` on SmolLM2-135M-Instruct
(recipes/llm/smollm2-wordnet-lora.json, --checkpoint none: the GGUF's own weights), the 8 prompts
of bench/generate_prompts.jsonl in one batch, the chat template applied, greedy, up to 32 new
tokens, in the recipe's bf16 or (dtype float32) fp32. Reads the tokens/s refit prints (decoding
only: the model is built before the clock starts) and prints JSON with ms per generated token of
the batch ("ms_per_step") and tokens/s, as the peer does.
Usage: python bench/refit_generate_smollm2.py BUILD_DIR [cpu|cuda] [bf16|fp32]
"""
import json, pathlib, re, subprocess, sys

build = pathlib.Path(sys.argv[1])
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
dtype = sys.argv[3] if len(sys.argv) > 3 else "bf16"
root = pathlib.Path(__file__).resolve().parent.parent
cmd = [str(build / "refit"), "generate", str(root / "recipes/llm/smollm2-wordnet-lora.json"), "--checkpoint", "none",
       "--prompts", str(root / "bench/generate_prompts.jsonl"), "--out", "/tmp/refit-bench-generate.jsonl",
       "--max-new-tokens", "32", "--batch-size", "8", "--set", "training.device=" + dev,
       "--set", "output.dir=/tmp/refit-bench-generate"]
if dtype == "fp32":
    cmd += ["--set", "models.0.dtype=float32", "--set", "training.precision=fp32"]
res = subprocess.run(cmd, capture_output=True, text=True)
text = res.stdout + res.stderr
m = re.search(r"wrote .*: (\d+) completions, (\d+) tokens, ([0-9.]+) tokens/s", text)
if res.returncode != 0 or not m:
    print(json.dumps({"error": "no throughput in: " + text.strip()[-400:]}))
    sys.exit(0)
tokens, rate = int(m.group(2)), float(m.group(3))
print(json.dumps({"impl": "refit-generate", "device": dev, "dtype": dtype, "tokens": tokens, "tokens_per_s": rate,
                  "ms_per_step": 1000 / rate}))
