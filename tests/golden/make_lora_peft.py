"""Golden data for refit's LoRA plugin, produced with HF PEFT.

For a Linear model (module "proj", plain LoRA), a Conv2d model (module "conv", rsLoRA) and a
dilated Conv2d model (conv_dilated: kernel 3, stride 3, padding 1, dilation 2, module "conv"):
  - base weights                      lora/<case>/base.safetensors
  - a PEFT-written adapter            lora/<case>/peft/adapter_model.safetensors + adapter_config.json
  - input, output, loss grads         lora/<case>/expected.safetensors
    (x, y = model(x), grad_A / grad_B of sum(y^2), merged weight from merge_and_unload)
lora_A/B are set to random values (B non-zero) so that the adapter changes the output.
PEFT builds a Conv2d's lora_A with the layer's kernel, stride and padding but not its dilation
(asserted below); the dilated case's shapes are chosen so that both branches give 3x3 outputs.
Its merge_and_unload changes the output (the composed kernel is applied dilated, the factors
were not): expected.safetensors also holds merged_y, the merged model's output, and the script
asserts that it differs from y (refit refuses to merge such a layer).

Then, for the refit-written adapter in lora/refit_written/ (written by the C++ test
"refit writes PEFT files" when REFIT_REGENERATE_GOLDEN=1), PEFT loads it onto the Linear model
and records its output in lora/refit_written/peft_output.safetensors.
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_lora_peft.py  (pip install peft)
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
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file

here = pathlib.Path(__file__).parent / "lora"


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


class DilatedConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=3, padding=1, dilation=2)

    def forward(self, x):
        return self.conv(x)


def case(name, make, x, config):
    out = here / name
    out.mkdir(parents=True, exist_ok=True)
    base = make()
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, str(out / "base.safetensors"))
    model = get_peft_model(base, config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.3)
    model.save_pretrained(str(out / "peft"))
    (out / "peft" / "README.md").unlink(missing_ok=True)  # PEFT's model card: not needed
    y = model(x)
    (y ** 2).sum().backward()
    grads = {}
    for n, p in model.named_parameters():
        if "lora_A" in n:
            grads["grad_A"] = p.grad.detach().clone()
        if "lora_B" in n:
            grads["grad_B"] = p.grad.detach().clone()
    target = "proj" if name == "linear" else "conv"
    layer = getattr(model.base_model.model, target)
    if isinstance(layer.base_layer, torch.nn.Conv2d):
        a = layer.lora_A["default"]
        assert a.dilation == (1, 1) and a.stride == layer.base_layer.stride and a.padding == layer.base_layer.padding
    merged = model.merge_and_unload()
    extra = {}
    if name == "conv_dilated":
        with torch.no_grad():
            extra["merged_y"] = merged(x)
        assert (extra["merged_y"] - y).abs().max() > 0.1, "PEFT's merge of a dilated conv kept the output"
    save_file({"x": x, "y": y.detach(), **grads, "merged_weight": getattr(merged, target).weight.detach().contiguous(),
               **extra},
              str(out / "expected.safetensors"), metadata={"peft": peft.__version__, "torch": torch.__version__})
    print(name, "ok")


torch.manual_seed(7)
case("linear", LinearNet, torch.randn(5, 8),
     LoraConfig(r=4, lora_alpha=8, target_modules=["proj"], lora_dropout=0.0))
case("conv", ConvNet, torch.randn(2, 3, 5, 5),
     LoraConfig(r=2, lora_alpha=4, target_modules=["conv"], lora_dropout=0.0, use_rslora=True))
case("conv_dilated", DilatedConvNet, torch.randn(2, 3, 9, 9),
     LoraConfig(r=3, lora_alpha=6, target_modules=["conv"], lora_dropout=0.0))

written = here / "refit_written"
if (written / "adapter_model.safetensors").exists():
    base = LinearNet()
    base.load_state_dict(load_file(str(here / "linear" / "base.safetensors")))
    model = PeftModel.from_pretrained(base, str(written))
    x = load_file(str(here / "linear" / "expected.safetensors"))["x"]
    with torch.no_grad():
        save_file({"y": model(x)}, str(written / "peft_output.safetensors"))
    print("refit-written adapter loaded by PEFT: output recorded")
