"""Golden data for long inputs to `refit predict --outputs features` on all-MiniLM-L6-v2: what
sentence-transformers itself computes (SentenceTransformer on the model folder: its modules.json
pipeline, truncating at the folder's sentence_bert_config.json max_seq_length, 256) for 16
fortunes records of 130 to 400 tokens, so that 4 of them are truncated. A text input that
truncates anywhere else (refit's old default was 128 tokens) fails the comparison.

Writes tests/golden/predict/:
  long_sentences.jsonl                16 lines {"text": ...}: the input refit predicts on (text_jsonl, no labels)
  minilm_long_embeddings.safetensors  embedding [16, 384] float32; tokens [16] int64 (untruncated lengths)
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_predict_minilm_long.py
     (REFIT_MINILM_DIR set by scripts/env.sh; Debian's fortunes in /usr/share/games/fortunes)
"""

PINNED = {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0", "sentence-transformers": "6.3.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import os
import pathlib

import torch
from safetensors.torch import save_file
from sentence_transformers import SentenceTransformer

here = pathlib.Path(__file__).parent / "predict"
model_dir = os.environ["REFIT_MINILM_DIR"]
model = SentenceTransformer(model_dir, device="cpu")
assert model.max_seq_length == 256, model.max_seq_length
tokenizer = model.tokenizer

# Every record of the fortunes files, in file order (sorted names), split at lines holding "%".
records = []
for f in sorted(pathlib.Path("/usr/share/games/fortunes").iterdir()):
    if f.suffix or not f.is_file() or f.name.endswith(".dat"):
        continue
    text = f.read_text(encoding="utf-8", errors="strict") if f.stat().st_size < 10_000_000 else ""
    for r in text.split("\n%\n"):
        r = r.strip("\n%")
        if r.strip():
            records.append(" ".join(r.split()))  # one line: whitespace runs become one space

# The first 12 records of 130-256 tokens and the first 4 of 257-400 (counted with [CLS]/[SEP]).
short, long = [], []
for r in records:
    n = len(tokenizer(r)["input_ids"])
    if 130 <= n <= 256 and len(short) < 12:
        short.append((r, n))
    elif 256 < n <= 400 and len(long) < 4:
        long.append((r, n))
    if len(short) == 12 and len(long) == 4:
        break
chosen = short + long
assert len(chosen) == 16
texts = [r for r, _ in chosen]
with torch.no_grad():
    emb = model.encode(texts, batch_size=16, convert_to_tensor=True, normalize_embeddings=False).float().cpu()
assert abs(emb.norm(dim=1) - 1).max() < 1e-5  # modules.json's Normalize ran

here.mkdir(parents=True, exist_ok=True)
with open(here / "long_sentences.jsonl", "w") as out:
    for t in texts:
        out.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
save_file({"embedding": emb.contiguous(), "tokens": torch.tensor([n for _, n in chosen], dtype=torch.int64)},
          str(here / "minilm_long_embeddings.safetensors"), metadata={"generator": "make_predict_minilm_long.py"})
print("tokens:", [n for _, n in chosen])
