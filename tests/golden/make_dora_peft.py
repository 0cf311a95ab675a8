"""Golden data for refit's DoRA ("use_dora": true in the lora plugin), produced with HF PEFT.

Two cases, each a one-layer model with the layer named as in make_lora_peft.py:
  dora/linear   Linear(8, 6) "proj", r = 4, alpha = 8
  dora/conv     Conv2d(3, 4, 3, padding 1) "conv", r = 2, alpha = 4, rsLoRA
For each:
  - base weights                      dora/<case>/base.safetensors
  - a PEFT-written adapter            dora/<case>/peft/ (lora_A, lora_B and lora_magnitude_vector set
                                      to random values so that each term matters)
  - expected.safetensors:
      init_magnitude                  the magnitude PEFT initialised (the row norms of the base weight)
      x, y = model(x)                 fp32
      grad_A, grad_B, grad_m, grad_x  gradients of sum(y^2) (the norm ||W + s B A|| is detached, as PEFT)
      y_bf16, grad_*_bf16             the same under torch.autocast("cpu", torch.bfloat16)
      merged_weight                   merge_and_unload's weight
Then, for the adapter refit wrote (dora/<case>/refit_written/, written by the C++ test "DoRA:
refit writes ..." when REFIT_REGENERATE_GOLDEN=1 together with refit_output.safetensors), PEFT loads
it with PeftModel.from_pretrained onto the base model; the script asserts that every tensor of the
file arrived in the model and that PEFT's output equals refit's (before and after
merge_and_unload), and records PEFT's output in refit_written/peft_output.safetensors.
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_dora_peft.py  (pip install peft)
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
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import load_file, save_file

here = pathlib.Path(__file__).parent / "lora" / "dora"
meta = {"peft": peft.__version__, "torch": torch.__version__}


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


def grads(model, x, autocast):
    model.zero_grad()
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = model(x)
    (y.float() ** 2).sum().backward()
    out = {"y": y.detach().float(), "grad_x": x.grad.detach().clone()}
    for n, p in model.named_parameters():
        for key, short in (("lora_A", "grad_A"), ("lora_B", "grad_B"), ("lora_magnitude_vector", "grad_m")):
            if key in n:
                out[short] = p.grad.detach().clone()
    assert len(out) == 5, list(out)
    return out


def case(name, make, x, config):
    out = here / name
    out.mkdir(parents=True, exist_ok=True)
    base = make()
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, str(out / "base.safetensors"))
    model = get_peft_model(base, config)
    mags = [p for n, p in model.named_parameters() if "lora_magnitude_vector" in n]
    assert len(mags) == 1
    init_magnitude = mags[0].detach().clone()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_magnitude_vector" in n:
                p.mul_(1 + 0.2 * torch.randn_like(p))
            elif "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.3)
    model.save_pretrained(str(out / "peft"))
    (out / "peft" / "README.md").unlink(missing_ok=True)
    fp32 = grads(model, x, False)
    bf16 = {k + "_bf16": v for k, v in grads(model, x, True).items()}
    merged = model.merge_and_unload()
    target = "proj" if name == "linear" else "conv"
    save_file({"init_magnitude": init_magnitude, "x": x, **fp32, **bf16,
               "merged_weight": getattr(merged, target).weight.detach().contiguous()},
              str(out / "expected.safetensors"), metadata=meta)
    print(name, "ok; magnitude shape", tuple(init_magnitude.shape), "file keys",
          sorted(load_file(str(out / "peft" / "adapter_model.safetensors"))))

    written = out / "refit_written"
    if (written / "adapter_model.safetensors").exists():
        base = make()
        base.load_state_dict(load_file(str(out / "base.safetensors")))
        model = PeftModel.from_pretrained(base, str(written))
        tensors = load_file(str(written / "adapter_model.safetensors"))
        state = get_peft_model_state_dict(model)
        assert sorted(state) == sorted(tensors), (sorted(state), sorted(tensors))
        for k, v in tensors.items():
            assert torch.equal(state[k], v), k  # every tensor of the file arrived
        refit = load_file(str(written / "refit_output.safetensors"))
        with torch.no_grad():
            y = model(x)
            assert (y - refit["y"]).abs().max() <= 1e-5, (y - refit["y"]).abs().max()
            merged_y = model.merge_and_unload()(x)
            assert (merged_y - refit["merged_y"]).abs().max() <= 1e-5, (merged_y - refit["merged_y"]).abs().max()
        save_file({"y": y, "merged_y": merged_y}, str(written / "peft_output.safetensors"), metadata=meta)
        print(name, "refit-written DoRA adapter: all", len(tensors), "tensors arrived in PEFT; outputs agree")


torch.manual_seed(11)
case("linear", LinearNet, torch.randn(5, 8),
     LoraConfig(r=4, lora_alpha=8, target_modules=["proj"], lora_dropout=0.0, use_dora=True))
case("conv", ConvNet, torch.randn(2, 3, 5, 5),
     LoraConfig(r=2, lora_alpha=4, target_modules=["conv"], lora_dropout=0.0, use_rslora=True, use_dora=True))
