"""PEFT's side of refit's MiniLM LoRA adapter: refit writes tests/golden/bert/refit_written/
(adapter_model.safetensors, adapter_config.json, and refit_output.safetensors: refit's
sentence embedding y — the normalised mean of the token states — and the same after merging,
merged_y, on the batch of minilm.safetensors;
written by the C++ test "bert: refit writes a MiniLM LoRA adapter ..." when
REFIT_REGENERATE_GOLDEN=1). Here PEFT 0.21.2 loads the folder with PeftModel.from_pretrained onto
transformers 5.24's BertModel with all-MiniLM-L6-v2's weights; the script asserts that every
tensor of the file arrived in the model, that PEFT's output equals refit's, and that
merge_and_unload gives refit's merged output, and records PEFT's outputs in
refit_written/peft_output.safetensors (which the C++ test compares with refit's).
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_bert_peft.py
     (pip install peft==0.21.2 transformers==5.24.0; REFIT_MINILM_DIR set by scripts/env.sh)
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "peft": "0.21.2", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

from peft_arrival import assert_all_arrived  # noqa: E402 (beside this script)

import os
import pathlib

import peft
import torch
import transformers
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import BertModel

golden = pathlib.Path(__file__).parent / "bert"
written = golden / "refit_written"
model_dir = pathlib.Path(os.environ["REFIT_MINILM_DIR"])
batch = load_file(str(golden / "minilm.safetensors"))
inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}

base = BertModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
model = PeftModel.from_pretrained(base, str(written)).eval()

file_tensors = assert_all_arrived(model, written / "adapter_model.safetensors", "BertModel")

def embedding(states):
    """sentence-transformers' mean pooling and Normalize, as refit's bert "features" (mean, normalize)."""
    m = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((states * m).sum(1) / m.sum(1).clamp(min=1e-9), p=2, dim=1)


refit = load_file(str(written / "refit_output.safetensors"))
with torch.no_grad():
    y = embedding(model(**inputs).last_hidden_state)
    merged = model.merge_and_unload()
    merged_y = embedding(merged(**inputs).last_hidden_state)
err = (y - refit["y"]).abs().max().item()
merged_err = (merged_y - refit["merged_y"]).abs().max().item()
print(f"PEFT vs refit: {err:.3g}, after merge_and_unload: {merged_err:.3g}")
assert err < 1e-4 and merged_err < 1e-4
save_file({"y": y.contiguous(), "merged_y": merged_y.contiguous()}, str(written / "peft_output.safetensors"),
          metadata={"peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__})
print("wrote", written / "peft_output.safetensors")
