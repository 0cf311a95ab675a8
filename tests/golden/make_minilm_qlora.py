"""QLoRA on all-MiniLM-L6-v2 as PEFT + bitsandbytes compute it on the CPU: the golden side of
refit's test "bert: QLoRA on all-MiniLM-L6-v2 ...".

The model is recipes/text/minilm-lora-bf16.json's backbone with its frozen base in NF4
(bitsandbytes' Linear4bit: blocks of 64, double quantization, float32 compute) under PEFT's LoRA
(r 8, alpha 16, the recipe's target_regex), its factors set to fixed values (not PEFT's
initialisation, whose zero B leaves every A without a gradient), and a 6-class linear head on
the normalised mean-pooled embedding, as the recipe's `linear_head`. One forward and backward
of the cross-entropy (mean over the batch) on tests/golden/bert/minilm.safetensors's padded
batch, labels i % 6.

Writes tests/golden/bert/minilm_qlora.safetensors:
  lora.<refit name> f32         the factors' values ("encoder.layer.0.attention.self.query.lora_default.lora_A")
  head.weight [6, 384], head.bias [6] f32, labels [8] int64
  loss [] f32                   PEFT + bitsandbytes' loss
  grad.lora.<refit name> f32    every LoRA factor's gradient; grad.head.weight, grad.head.bias
Run: source scripts/env.sh; ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_minilm_qlora.py
     (pip install bitsandbytes==0.50.2 peft==0.21.2 transformers==5.24.0)
"""

PINNED = {"torch": "2.11.0", "bitsandbytes": "0.50.2", "peft": "0.21.2", "transformers": "5.24.0",
          "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import os
import pathlib
import re

import bitsandbytes as bnb
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import BertModel

root = pathlib.Path(__file__).resolve().parents[2]
golden = pathlib.Path(__file__).parent / "bert"
recipe = json.loads((root / "recipes/text/minilm-lora-bf16.json").read_text())
lora_config = recipe["models"][0]["adapters"][0]["config"]
target = lora_config["target_regex"]
batch = load_file(str(golden / "minilm.safetensors"))
inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}

torch.manual_seed(0)
base = BertModel.from_pretrained(os.environ["REFIT_MINILM_DIR"], attn_implementation="sdpa").eval()
# The frozen base's adaptable Linear layers (refit quantizes every refit::nn::Linear of bert: the
# encoder's projections) as bitsandbytes' NF4 Linear4bit, quantized from the fp32 weights.
quantized = 0
for name, module in list(base.named_modules()):
    if not re.fullmatch(r"encoder\.layer\.[0-9]+\.(attention\.self\.(query|key|value)|attention\.output\.dense|"
                        r"intermediate\.dense|output\.dense)", name):
        continue
    q = bnb.nn.Linear4bit(module.in_features, module.out_features, bias=module.bias is not None,
                          compute_dtype=torch.float32, quant_type="nf4", compress_statistics=True)
    q.weight = bnb.nn.Params4bit(module.weight.data.clone(), requires_grad=False, quant_type="nf4", blocksize=64,
                                 compress_statistics=True)
    q.bias = module.bias
    q = q.to("cpu")  # quantizes
    parent, child = name.rsplit(".", 1)
    setattr(base.get_submodule(parent), child, q)
    quantized += 1
assert quantized == 36, quantized
for p in base.parameters():
    p.requires_grad_(False)

model = get_peft_model(base, LoraConfig(r=lora_config["r"], lora_alpha=lora_config["alpha"], target_modules=target,
                                        lora_dropout=0.0, bias="none"))


def refit_name(peft_name):
    """base_model.model.encoder...query.lora_A.default.weight -> encoder...query.lora_default.lora_A"""
    m = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])\.default\.weight", peft_name)
    assert m, peft_name
    return f"{m.group(1)}.lora_default.lora_{m.group(2)}"


out = {}
factors = sorted((n, p) for n, p in model.named_parameters() if "lora_" in n)
assert len(factors) == 72, len(factors)
with torch.no_grad():
    for k, (n, p) in enumerate(factors, start=1):
        p.copy_((torch.arange(p.numel(), dtype=torch.float32) * 0.37 * k).sin().reshape(p.shape) * 0.05)
        out["lora." + refit_name(n)] = p.detach().clone()
head_w = (torch.randn(6, 384) * 0.1).requires_grad_(True)
head_b = (torch.randn(6) * 0.1).requires_grad_(True)
labels = torch.arange(8) % 6

states = model(**inputs).last_hidden_state
m = inputs["attention_mask"].unsqueeze(-1).float()
features = torch.nn.functional.normalize((states * m).sum(1) / m.sum(1).clamp(min=1e-9), p=2, dim=1)
loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(features, head_w, head_b), labels)
loss.backward()
print("loss", loss.item())
for n, p in factors:
    out["grad.lora." + refit_name(n)] = p.grad.detach().clone()
out.update({"head.weight": head_w.detach(), "head.bias": head_b.detach(), "labels": labels, "loss": loss.detach(),
            "grad.head.weight": head_w.grad, "grad.head.bias": head_b.grad})
save_file(out, str(golden / "minilm_qlora.safetensors"),
          metadata={"generator": "tests/golden/make_minilm_qlora.py", **{k: v for k, v in PINNED.items()}})
print("wrote", golden / "minilm_qlora.safetensors", len(out), "tensors")
