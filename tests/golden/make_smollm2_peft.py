"""PEFT's and transformers' side of the files refit writes for SmolLM2-135M-Instruct: the LoRA
adapter (PEFT layout) and the merged export (model.safetensors + config.json).

1. Runs the C++ case "llama: refit's SmolLM2 LoRA adapter loads completely in PEFT ..." of
   build/tests/refit_llama_tests (REFIT_BUILD_DIR overrides build/) with REFIT_REGENERATE_GOLDEN=1
   and REFIT_GOLDEN_WORK=<a temporary folder>: refit writes there its LoRA adapter (r 2 on every
   projection of the 30 layers, deterministic factors), its logits at the fixture's 512 columns
   on the first 3 prompts of tests/golden/llama/smollm2.safetensors (unmerged and merged), and its
   merged float32 export through the recipe (refit export --format merged).
2. PEFT 0.21.2 loads the adapter with PeftModel.from_pretrained onto transformers 5.24's
   LlamaForCausalLM of the same GGUF ($REFIT_SMOLLM2_GGUF, dequantized to float32): every tensor
   of the file must arrive with its values, and PEFT's logits (and after merge_and_unload) must be
   refit's within 1e-3 (the C++ test applies the derived bound).
3. transformers loads refit's export folder with from_pretrained: no missing, unexpected or
   mismatched key may remain; its logits are recorded.

Writes tests/golden/llama/smollm2_peft/:
  adapter_config.json      the adapter config PEFT loaded (refit's, verbatim)
  peft_output.safetensors  peft_logits, peft_merged_logits, export_logits [positions, 512] float32;
                           digest [420, 2] float64: each adapter tensor's sum and sum of squares, by
                           sorted key (the C++ test rebuilds the 2.4 MB adapter and compares)
  export.json              the export's config.json, its keys and shapes, transformers' loading info
Run: source scripts/env.sh; ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_smollm2_peft.py
     (after building refit_llama_tests and the plugins)
"""

PINNED = {"torch": "2.11.0", "peft": "0.21.2", "transformers": "5.24.0", "safetensors": "0.8.0", "gguf": "0.19.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

from peft_arrival import assert_all_arrived  # noqa: E402 (beside this script)

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import peft
import torch
import transformers
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM

root = pathlib.Path(__file__).resolve().parent.parent.parent
build = pathlib.Path(os.environ.get("REFIT_BUILD_DIR", root / "build"))
out = root / "tests/golden/llama/smollm2_peft"
out.mkdir(exist_ok=True)
gguf = pathlib.Path(os.environ["REFIT_SMOLLM2_GGUF"])
work = pathlib.Path(tempfile.mkdtemp(prefix="refit-smollm2-peft-"))

case = "llama: refit's SmolLM2 LoRA adapter loads completely in PEFT and its merged export strictly in " \
       "LlamaForCausalLM, both with refit's logits (golden)"
env = dict(os.environ, REFIT_REGENERATE_GOLDEN="1", REFIT_GOLDEN_WORK=str(work), REFIT_SOURCE_DIR=str(root))
# The fixture files are written below: the C++ case's own comparisons with them are not run here.
subprocess.run([str(build / "tests/refit_llama_tests"), case.replace(",", "\\,"), "--out", str(work / "catch.txt")], env=env,
               cwd=build / "tests")
for f in ("adapter/adapter_model.safetensors", "adapter/adapter_config.json", "refit_output.safetensors",
          "export/lm/model.safetensors", "export/lm/config.json"):
    assert (work / f).exists(), f"the C++ case did not write {f} (see {work / 'catch.txt'})"

fixture = load_file(str(root / "tests/golden/llama/smollm2.safetensors"))
lengths = fixture["lengths"][:3].tolist()
starts = [sum(lengths[:i]) for i in range(3)]
prompts = [fixture["input_ids"][s:s + n].unsqueeze(0) for s, n in zip(starts, lengths)]
columns = fixture["columns"]


def logits_of(model):
    with torch.no_grad():
        return torch.cat([model(input_ids=ids).logits[0][:, columns] for ids in prompts])


base = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
model = PeftModel.from_pretrained(base, str(work / "adapter")).eval()
file_tensors = assert_all_arrived(model, work / "adapter/adapter_model.safetensors", "LlamaForCausalLM")

refit = load_file(str(work / "refit_output.safetensors"))
peft_logits = logits_of(model)
merged_model = model.merge_and_unload()
peft_merged = logits_of(merged_model)
err = (peft_logits - refit["logits"]).abs().max().item()
merged_err = (peft_merged - refit["merged_logits"]).abs().max().item()
print(f"PEFT vs refit logits: {err:.3g}; after merge_and_unload: {merged_err:.3g}")
assert err < 1e-3 and merged_err < 1e-3

exported, info = LlamaForCausalLM.from_pretrained(work / "export/lm", output_loading_info=True)
exported.eval()
print("transformers loading refit's merged export:", info)
assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
assert exported.dtype == torch.float32 and exported.config.tie_word_embeddings
export_logits = logits_of(exported)
export_err = (export_logits - refit["merged_logits"]).abs().max().item()
print(f"refit's merged export in transformers vs refit's merged logits: {export_err:.3g}")
assert export_err < 1e-3

digest = torch.tensor([[file_tensors[k].double().sum().item(), file_tensors[k].double().pow(2).sum().item()]
                       for k in sorted(file_tensors)], dtype=torch.float64)
versions = {"peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
save_file({"peft_logits": peft_logits.contiguous(), "peft_merged_logits": peft_merged.contiguous(),
           "export_logits": export_logits.contiguous(), "digest": digest}, str(out / "peft_output.safetensors"),
          metadata=versions)
shutil.copy(work / "adapter/adapter_config.json", out / "adapter_config.json")
header = json.loads(open(work / "export/lm/model.safetensors", "rb").read(
    8 + int.from_bytes(open(work / "export/lm/model.safetensors", "rb").read(8), "little"))[8:])
keys = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
json.dump({"config": json.load(open(work / "export/lm/config.json")), "keys": keys,
           "loading_info": {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs"},
           "checked": {"adapter_tensors_arrived": len(file_tensors), "peft_vs_refit": err,
                       "peft_merged_vs_refit": merged_err, "export_vs_refit_merged": export_err, **versions}},
          open(out / "export.json", "w"), indent=1, sort_keys=True)
shutil.rmtree(work)
print("wrote", out)
