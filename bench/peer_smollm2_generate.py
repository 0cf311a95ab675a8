"""The Python peer of bench/refit_generate_smollm2.py: transformers' `generate` on the same GGUF
(dequantized by transformers, as refit does), the same 8 prompts rendered with the same chat
template in one left-padded batch, greedy, up to 32 new tokens, with the KV cache, in bf16 or fp32
(eager; no compile). Times the `generate` call only (the model is loaded before the clock starts)
and prints JSON with ms per generated token and tokens/s, counting the tokens of each completion up
to and including its EOS (what refit counts).
Usage: python bench/peer_smollm2_generate.py [cpu|cuda] [bf16|fp32]   (REFIT_SMOLLM2_GGUF: scripts/env.sh)
"""
import json, os, pathlib, sys, time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[2] if len(sys.argv) > 2 else "bf16"]
gguf = pathlib.Path(os.environ["REFIT_SMOLLM2_GGUF"])
root = pathlib.Path(__file__).resolve().parent.parent
tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
tok.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype).to(dev).eval()
prompts = [json.loads(l)["prompt"] for l in open(root / "bench/generate_prompts.jsonl")]
texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
         for p in prompts]
batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
eos = tok.eos_token_id
with torch.inference_mode():
    start = time.perf_counter()
    out = model.generate(**batch, max_new_tokens=32, do_sample=False, pad_token_id=tok.pad_token_id or eos)
    if dev == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
new = out[:, batch["input_ids"].shape[1]:].tolist()
tokens = 0
for row in new:
    n = len(row)
    if eos in row:
        n = row.index(eos) + 1
    tokens += n
print(json.dumps({"impl": "transformers-generate", "device": dev, "dtype": str(dtype), "tokens": tokens,
                  "tokens_per_s": tokens / seconds, "ms_per_step": seconds * 1000 / tokens}))
