"""Golden data for refit's LoRA plugin, produced with HF PEFT.

For a Linear model (module "proj", plain LoRA) and a Conv2d model (module "conv", rsLoRA):
  - base weights                      lora/<case>/base.safetensors
  - a PEFT-written adapter            lora/<case>/peft/adapter_model.safetensors + adapter_config.json
  - input, output, loss grads         lora/<case>/expected.safetensors
    (x, y = model(x), grad_A / grad_B of sum(y^2), merged weight from merge_and_unload)
lora_A/B are set to random values (B non-zero) so that the adapter changes the output.

Then, for the refit-written adapter in lora/refit_written/ (written by the C++ test
"refit writes PEFT files" when REFIT_REGENERATE_GOLDEN=1), PEFT loads it onto the Linear model
and records its output in lora/refit_written/peft_output.safetensors.
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_lora_peft.py  (pip install peft)
"""
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
    merged = model.merge_and_unload()
    target = "proj" if name == "linear" else "conv"
    save_file({"x": x, "y": y.detach(), **grads, "merged_weight": getattr(merged, target).weight.detach().contiguous()},
              str(out / "expected.safetensors"), metadata={"peft": peft.__version__, "torch": torch.__version__})
    print(name, "ok")


torch.manual_seed(7)
case("linear", LinearNet, torch.randn(5, 8),
     LoraConfig(r=4, lora_alpha=8, target_modules=["proj"], lora_dropout=0.0))
case("conv", ConvNet, torch.randn(2, 3, 5, 5),
     LoraConfig(r=2, lora_alpha=4, target_modules=["conv"], lora_dropout=0.0, use_rslora=True))

written = here / "refit_written"
if (written / "adapter_model.safetensors").exists():
    base = LinearNet()
    base.load_state_dict(load_file(str(here / "linear" / "base.safetensors")))
    model = PeftModel.from_pretrained(base, str(written))
    x = load_file(str(here / "linear" / "expected.safetensors"))["x"]
    with torch.no_grad():
        save_file({"y": model(x)}, str(written / "peft_output.safetensors"))
    print("refit-written adapter loaded by PEFT: output recorded")
