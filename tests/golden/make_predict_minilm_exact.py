"""The exact sentence embeddings of tests/golden/predict's inputs: transformers' BertModel with
all-MiniLM-L6-v2's weights in float64, mean pooled over the real tokens and normalised (the
model's modules.json pipeline), each input tokenized as the fp32 fixtures were
(make_predict_minilm.py: whole, one at a time; make_predict_minilm_long.py: cut at the folder's
max_seq_length, 256). The predict tests bound refit's fp32 embeddings, and the fp32 fixtures',
each against these: the error of one fp32 run, not twice it.

Writes tests/golden/predict/:
  minilm_embeddings_exact.safetensors       embedding [24, 384] float64 (sentences.jsonl)
  minilm_long_embeddings_exact.safetensors  embedding [16, 384] float64 (long_sentences.jsonl)
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_predict_minilm_exact.py
     (REFIT_MINILM_DIR set by scripts/env.sh)
"""

PINNED = {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import os
import pathlib

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import BertModel, BertTokenizerFast

here = pathlib.Path(__file__).parent / "predict"
model_dir = pathlib.Path(os.environ["REFIT_MINILM_DIR"])
tokenizer = BertTokenizerFast.from_pretrained(model_dir)
model = BertModel.from_pretrained(model_dir, attn_implementation="eager").double().eval()

for inputs, fp32, out, max_length in (("sentences.jsonl", "minilm_embeddings.safetensors",
                                        "minilm_embeddings_exact.safetensors", None),
                                       ("long_sentences.jsonl", "minilm_long_embeddings.safetensors",
                                        "minilm_long_embeddings_exact.safetensors", 256)):
    texts = [json.loads(line)["text"] for line in open(here / inputs, encoding="utf-8")]
    rows = []
    with torch.no_grad():
        for t in texts:
            enc = tokenizer(t, return_tensors="pt", truncation=max_length is not None, max_length=max_length)
            states = model(**enc).last_hidden_state  # [1, T, 384] float64
            mask = enc["attention_mask"].unsqueeze(-1).to(torch.float64)
            mean = (states * mask).sum(1) / mask.sum(1)
            rows.append(torch.nn.functional.normalize(mean, p=2, dim=1)[0])
    exact = torch.stack(rows).contiguous()
    # The fp32 fixture is the same function: within fp32 error of it.
    diff = (load_file(str(here / fp32))["embedding"].to(torch.float64) - exact).abs().max().item()
    print(f"{fp32}: max |fp32 - exact| {diff:.3g}")
    assert diff < 1e-5, diff
    save_file({"embedding": exact}, str(here / out),
              metadata={"generator": "make_predict_minilm_exact.py", "transformers": transformers.__version__,
                        "torch": torch.__version__})
    print("wrote", here / out, tuple(exact.shape))
