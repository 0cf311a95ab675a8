"""Python peer of bench/minilm_lora_step.cpp: recipes/text/minilm-lora-bf16.json's step in eager
PyTorch + transformers + HF PEFT.

transformers' BertModel with all-MiniLM-L6-v2's weights ($REFIT_MINILM_DIR), frozen in bf16; PEFT
LoRA r=8 alpha=16 (fp32) on every layer's attention query/key/value, attention output dense,
intermediate dense and output dense; a fp32 Linear(384, 6) head on the normalised mean-pooled
embedding; bf16 autocast, AdamW (fused, as refit; head lr 0.05, LoRA 0.002), clip 1.0; one fixed
batch of 32 sequences of 64 tokens (random ids, the attention mask all ones). Prints JSON.
REFIT_BENCH_NF4=1: the frozen base's targeted Linear layers in bitsandbytes' NF4 (QLoRA).
Usage: python bench/peer_minilm_lora.py [cpu|cuda] [steps]   (pip install transformers peft bitsandbytes)
"""
import os, sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import BertModel

from peer_support import time_and_report, train_step

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
torch.manual_seed(0)
backbone = BertModel.from_pretrained(os.environ["REFIT_MINILM_DIR"], attn_implementation="sdpa").to(torch.bfloat16)
if os.environ.get("REFIT_BENCH_CHECKPOINTING") == "1":
    # refit's /models/0/gradient_checkpointing: every layer recomputed in the backward. The
    # non-reentrant form gives LoRA in the frozen layers its gradients without
    # enable_input_require_grads().
    backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
targets = r"encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)"
if os.environ.get("REFIT_BENCH_NF4") == "1":
    # QLoRA: the targeted Linear layers as bitsandbytes' NF4 Linear4bit (blocks of 64, double
    # quantization, bf16 compute), quantized from the fp32 weights, as refit's "dtype": "nf4".
    import re
    import bitsandbytes as bnb
    full = BertModel.from_pretrained(os.environ["REFIT_MINILM_DIR"], attn_implementation="sdpa")
    for name, module in list(full.named_modules()):
        if re.fullmatch(targets, name):
            q = bnb.nn.Linear4bit(module.in_features, module.out_features, bias=module.bias is not None,
                                  compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=True)
            q.weight = bnb.nn.Params4bit(module.weight.data.clone(), requires_grad=False, quant_type="nf4",
                                         blocksize=64, compress_statistics=True)
            q.bias = torch.nn.Parameter(module.bias.data.to(torch.bfloat16), requires_grad=False)
            parent, child = name.rsplit(".", 1)
            setattr(backbone.get_submodule(parent), child, q.to(dev))
model = get_peft_model(backbone, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
head = torch.nn.Linear(384, 6)
model, head = model.to(dev), head.to(dev)
# from_pretrained returns the model in eval mode; the recipe trains with the backbone's dropout
# (config.json: hidden and attention-probabilities dropout 0.1), as refit's side does.
model.train()
lora = [p for p in model.parameters() if p.requires_grad]
assert all(p.dtype == torch.float32 for p in lora)
opt = torch.optim.AdamW([{"params": lora, "lr": 2e-3}, {"params": list(head.parameters()), "lr": 0.05}],
                        weight_decay=0.0, fused=True)
params = lora + list(head.parameters())
ids = torch.randint(1000, 30000, (32, 64), device=dev)
mask = torch.ones_like(ids)
types = torch.zeros_like(ids)
y = torch.randint(0, 6, (32,), device=dev)


def compute_loss():
    with torch.autocast(dev, dtype=torch.bfloat16):
        states = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        m = mask.unsqueeze(-1).float()
        pooled = torch.nn.functional.normalize((states.float() * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1)
        logits = head(pooled)
    return torch.nn.functional.cross_entropy(logits.float(), y)


time_and_report(train_step(compute_loss, params, opt), dev, steps, 5, params)
