"""Golden data for PEFT adapters of refit's "vit", checked against HF PEFT on transformers' Dinov2Model.

transformers >= 5 names Dinov2's attention projections attention.q_proj / k_proj / v_proj / o_proj
in memory (its files keep attention.attention.query ... / attention.output.dense), and PEFT builds
and loads adapter layers by in-memory names. The base model is tests/golden/dinov2/plain (hidden
32, 2 layers, patch 4, image 16); LoRA r = 2, alpha = 4 on every Linear / Conv2d: 13 layers,
26 tensors.

  lora/vit/peft/                    written by PEFT (get_peft_model + save_pretrained, random
                                    factors): keys with the in-memory names
  lora/vit/expected.safetensors     x [2, 3, 16, 16] and y, PEFT's last_hidden_state with that adapter

Then, for the adapter refit wrote (lora/vit/refit_written/, with refit_output.safetensors: refit's
own output y and its output after merging, merged_y; written by the C++ test "vit: refit writes
a PEFT adapter that PEFT loads completely onto transformers' Dinov2Model" when
REFIT_REGENERATE_GOLDEN=1), PEFT loads it with PeftModel.from_pretrained onto a fresh Dinov2Model.
The script asserts that every tensor of the file arrived in the model (and no LoRA parameter
kept its initial value), that PEFT's output equals refit's, and that merge_and_unload gives
refit's merged output; it records PEFT's outputs in lora/vit/refit_written/peft_output.safetensors.
It also shows what the file names (attention.attention.query ...) give: PEFT loads only the
layers whose names agree and drops the rest without an error.
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_lora_vit.py  (pip install peft transformers)
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "peft": "0.21.2", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import pathlib
import shutil
import tempfile

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import Dinov2Model

golden = pathlib.Path(__file__).parent
base_dir = golden / "dinov2" / "plain"
here = golden / "lora" / "vit"
meta = {"peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2", "projection"]
# transformers' conversion_mapping for Dinov2Model: file name -> in-memory name.
FILE_NAMES = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
              "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense"}


def base_model():
    return Dinov2Model.from_pretrained(str(base_dir)).eval()


def arrived(model, folder):
    """How many of the file's tensors are in the model's LoRA parameters, and the file's count."""
    state = model.state_dict()
    tensors = load_file(str(pathlib.Path(folder) / "adapter_model.safetensors"))
    n = 0
    for key, value in tensors.items():
        in_model = key.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        if in_model in state and torch.equal(state[in_model], value):
            n += 1
    return n, len(tensors)


here.mkdir(parents=True, exist_ok=True)
torch.manual_seed(11)
x = torch.randn(2, 3, 16, 16)

# PEFT's own adapter on transformers' Dinov2Model.
model = get_peft_model(base_model(), LoraConfig(r=2, lora_alpha=4, target_modules=TARGETS, lora_dropout=0.0))
with torch.no_grad():
    for n, p in model.named_parameters():
        if "lora_" in n:
            p.copy_(torch.randn_like(p) * 0.3)
model.save_pretrained(str(here / "peft"))
(here / "peft" / "README.md").unlink(missing_ok=True)
config_file = here / "peft" / "adapter_config.json"  # the base model's path, relative to the repository
config = json.loads(config_file.read_text())
config["base_model_name_or_path"] = "tests/golden/dinov2/plain"
config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
keys = load_file(str(here / "peft" / "adapter_model.safetensors")).keys()
assert len(keys) == 26 and any(".attention.q_proj.lora_A" in k for k in keys), sorted(keys)
with torch.no_grad():
    save_file({"x": x, "y": model(pixel_values=x).last_hidden_state}, str(here / "expected.safetensors"), metadata=meta)
print("PEFT-written ViT adapter: 26 tensors, in-memory names")

written = here / "refit_written"
if (written / "adapter_model.safetensors").exists():
    refit = load_file(str(written / "refit_output.safetensors"))
    model = PeftModel.from_pretrained(base_model(), str(written))
    n, total = arrived(model, written)
    lora_params = [k for k in model.state_dict() if ".lora_" in k]
    print(f"refit-written ViT adapter: {n} of {total} tensors arrived in PEFT's Dinov2Model "
          f"({len(lora_params)} LoRA parameters)")
    assert n == total == len(lora_params) == 26
    with torch.no_grad():
        y = model(pixel_values=x).last_hidden_state
        merged = model.merge_and_unload()
        merged_y = merged(pixel_values=x).last_hidden_state
    err, merged_err = (y - refit["y"]).abs().max().item(), (merged_y - refit["merged_y"]).abs().max().item()
    print(f"  PEFT vs refit: max abs error {err:.3g}; merged (merge_and_unload vs refit's merge) {merged_err:.3g}")
    assert err <= 1e-5 and merged_err <= 1e-5
    save_file({"y": y, "merged_y": merged_y}, str(written / "peft_output.safetensors"), metadata=meta)

    # The same adapter keyed by the file names: PEFT creates no layers for the attention
    # projections, loads the rest, and says nothing.
    with tempfile.TemporaryDirectory() as tmp:
        tensors = load_file(str(written / "adapter_model.safetensors"))
        renamed = {}
        for k, v in tensors.items():
            for memory, file in FILE_NAMES.items():
                k = k.replace("." + memory + ".", "." + file + ".")
            renamed[k] = v
        save_file(renamed, str(pathlib.Path(tmp) / "adapter_model.safetensors"))
        config = json.loads((written / "adapter_config.json").read_text())
        paths = []
        for t in config["target_modules"]:
            for memory, file in FILE_NAMES.items():
                t = (t + ".").replace("." + memory + ".", "." + file + ".")[:-1]
            paths.append(t)
        config["target_modules"] = paths
        (pathlib.Path(tmp) / "adapter_config.json").write_text(json.dumps(config))
        n, total = arrived(PeftModel.from_pretrained(base_model(), tmp), tmp)
        print(f"  the same adapter with the file names: {n} of {total} tensors arrived")
        assert n < total
