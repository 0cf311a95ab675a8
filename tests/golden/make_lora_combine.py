"""Golden data for refit's LoRA combinations ("combine" in the lora plugin), produced with PEFT's
add_weighted_adapter (PEFT 0.21.2).

For the Linear model of make_lora_peft.py ("proj", 8 -> 6) and its Conv2d model ("conv", 3 -> 4,
kernel 3, padding 1): two adapters, "one" (r = 4 / 2, alpha 8) and "two" (r = 4 / 2, alpha 2), with
random factors, combined with weights [0.7, -0.4] as "linear", "cat" and "svd" (svd_rank 3 / 2).
lora/combine/<case>.safetensors holds the base weights (weight, bias), x, the sources' factors
(one.A, one.B, two.A, two.B) and per combination its factors (<type>.A, <type>.B) and the model's output
with only that adapter active (<type>.y).
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_lora_combine.py  (pip install peft)
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "peft": "0.21.2", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import pathlib

import peft
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

here = pathlib.Path(__file__).parent / "lora" / "combine"


class LinearNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 6)

    def forward(self, x):
        return self.proj(x)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=1, padding=1)

    def forward(self, x):
        return self.conv(x)


def case(name, make, target, x, r, svd_rank):
    base = make()
    layer = getattr(base, target)
    out = {"weight": layer.weight.detach().clone(), "bias": layer.bias.detach().clone(), "x": x}
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=8, target_modules=[target]), adapter_name="one")
    model.add_adapter("two", LoraConfig(r=r, lora_alpha=2, target_modules=[target]))
    lora = getattr(model.base_model.model, target)
    with torch.no_grad():
        for n in ("one", "two"):
            for f in (lora.lora_A[n], lora.lora_B[n]):
                f.weight.copy_(torch.randn_like(f.weight) * 0.3)
            out[n + ".A"] = lora.lora_A[n].weight.detach().clone()
            out[n + ".B"] = lora.lora_B[n].weight.detach().clone()
    for kind in ("linear", "cat", "svd"):
        model.add_weighted_adapter(["one", "two"], [0.7, -0.4], kind, combination_type=kind,
                                   svd_rank=svd_rank if kind == "svd" else None)
        model.set_adapter(kind)
        with torch.no_grad():
            out[kind + ".y"] = model(x)
        out[kind + ".A"] = lora.lora_A[kind].weight.detach().clone()
        out[kind + ".B"] = lora.lora_B[kind].weight.detach().clone()
        print(name, kind, "rank", out[kind + ".A"].shape[0], "scaling", lora.scaling[kind])
    here.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, str(here / (name + ".safetensors")),
              metadata={"peft": peft.__version__, "torch": torch.__version__})


torch.manual_seed(5)
case("linear", LinearNet, "proj", torch.randn(5, 8), 4, 3)
case("conv", ConvNet, "conv", torch.randn(2, 3, 5, 5), 2, 2)
