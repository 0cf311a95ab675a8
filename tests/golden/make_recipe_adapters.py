"""PEFT-written adapters for the test recipe tests/recipes/two-adapters.json (refit's "mlp" with
in_features 16, hidden [16], out_features 4: Linear layers "layers.0" and "layers.1").

  tests/recipes/peft-mlp/frozen/   LoRA r = 2, alpha = 4 on both layers: the recipe keeps it frozen and active
  tests/recipes/peft-mlp/tuned/    LoRA r = 4, alpha = 4, DoRA, on both layers: the recipe continues training it
Written by PEFT 0.21.2 (get_peft_model + save_pretrained) with random factors (B non-zero) and, for
DoRA, a perturbed magnitude, so that each adapter changes the output.
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_recipe_adapters.py  (pip install peft)
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "peft": "0.21.2"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import pathlib

import torch
from peft import LoraConfig, get_peft_model

here = pathlib.Path(__file__).parent.parent / "recipes" / "peft-mlp"


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)])

    def forward(self, x):
        return self.layers[1](torch.nn.functional.gelu(self.layers[0](x)))


def write(name, config):
    model = get_peft_model(Mlp(), config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_magnitude_vector" in n:
                p.mul_(1 + 0.1 * torch.randn_like(p))
            elif "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(str(here / name))
    (here / name / "README.md").unlink(missing_ok=True)
    print(name, "written")


torch.manual_seed(3)
write("frozen", LoraConfig(r=2, lora_alpha=4, target_modules=["layers.0", "layers.1"], lora_dropout=0.0))
write("tuned", LoraConfig(r=4, lora_alpha=4, target_modules=["layers.0", "layers.1"], lora_dropout=0.0, use_dora=True))
