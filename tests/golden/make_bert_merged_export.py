"""Golden data for `refit export --format merged` on all-MiniLM-L6-v2, checked from the other side:
transformers loads the file refit writes.

1. The keys (and shapes) transformers' BertModel (add_pooling_layer, the model's config.json)
   saves: tests/golden/bert/merged_export_keys.json, which the C++ test compares with refit's
   merged export key for key.
2. refit (REFIT, default build/refit) exports the MiniLM LoRA recipe's backbone merged in float32
   (--checkpoint none: the recipe's own weights); the file, renamed model.safetensors beside the
   model's config.json, is loaded with BertModel.from_pretrained: no missing, unexpected or
   mismatched key may remain, and its sentence embeddings (mean pooled, normalised) on
   tests/golden/predict/sentences.jsonl must equal `refit predict --outputs features` within 1e-5.
   What it found is recorded in the fixture ("checked").
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_bert_merged_export.py
     (after building refit and the plugins; REFIT_MINILM_DIR set by scripts/env.sh)
"""

PINNED = {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import torch
import transformers
from transformers import BertConfig, BertModel, BertTokenizerFast

root = pathlib.Path(__file__).resolve().parent.parent.parent
model_dir = pathlib.Path(os.environ["REFIT_MINILM_DIR"])
refit = os.environ.get("REFIT", str(root / "build" / "refit"))
recipe = str(root / "recipes/text/minilm-lora-bf16.json")
fp32 = ["--set", "models.0.dtype=float32", "--set", "training.precision=fp32"]

reference = BertModel(BertConfig.from_pretrained(model_dir))
keys = {k: list(v.shape) for k, v in reference.state_dict().items()}

work = pathlib.Path(tempfile.mkdtemp(prefix="refit-merged-"))
subprocess.run([refit, "export", recipe, "--checkpoint", "none", "--format", "merged", "--dtype", "float32",
                "--out", str(work / "export"), "--set", f"output.dir={work / 'run'}", *fp32], check=True)
folder = work / "bert"
folder.mkdir()
shutil.copy(work / "export" / "backbone.safetensors", folder / "model.safetensors")
shutil.copy(model_dir / "config.json", folder / "config.json")
model, info = BertModel.from_pretrained(folder, output_loading_info=True, attn_implementation="eager")
model.eval()
print("transformers loading refit's merged file:", info)
assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info

sentences = [json.loads(l)["text"] for l in open(root / "tests/golden/predict/sentences.jsonl")]
component = {"type": "text_jsonl", "config": {"tokenizer": str(model_dir),
                                               "file": str(root / "tests/golden/predict/sentences.jsonl")}}
subprocess.run([refit, "predict", recipe, "--checkpoint", "none", "--models", "backbone", "--outputs", "features",
                "--top-k", "0", "--input", json.dumps(component), "--out", str(work / "features.jsonl"),
                "--set", f"output.dir={work / 'run'}", *fp32], check=True)
refit_features = torch.tensor([json.loads(l)["features"] for l in open(work / "features.jsonl")], dtype=torch.float64)
tokenizer = BertTokenizerFast.from_pretrained(model_dir)
worst = 0.0
with torch.no_grad():
    for i, s in enumerate(sentences):
        enc = tokenizer(s, return_tensors="pt")
        states = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        e = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=1)[0].double()
        worst = max(worst, (e - refit_features[i]).abs().max().item())
print("embeddings of the loaded file vs refit predict, max abs difference:", worst)
assert worst < 1e-5

out = root / "tests/golden/bert/merged_export_keys.json"
json.dump({"keys": keys,
           "checked": {"missing_keys": sorted(info["missing_keys"]), "unexpected_keys": sorted(info["unexpected_keys"]),
                       "mismatched_keys": sorted(map(str, info["mismatched_keys"])),
                       "embedding_max_abs_difference_vs_refit_predict": worst,
                       "transformers": transformers.__version__, "torch": torch.__version__}},
          open(out, "w"), indent=1, sort_keys=True)
shutil.rmtree(work)
print("wrote", out, len(keys), "keys")
