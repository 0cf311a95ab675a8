"""Python peer of bench/smollm2_lora_step.cpp: recipes/llm/smollm2-wordnet-lora.json's step in
eager PyTorch + transformers + HF PEFT.

transformers' LlamaForCausalLM from the same GGUF ($REFIT_SMOLLM2_GGUF, dequantized), frozen in
bf16; PEFT LoRA r=8 alpha=16 (fp32) on q/k/v/o/gate/up/down_proj; bf16 autocast, transformers'
causal-LM loss (labels = input ids), AdamW (lr 1e-3, no weight decay), clip 1.0; one fixed batch
of 2 sequences of 256 tokens (random ids; refit's packed batches are at most 256). Prints JSON.
Usage: python bench/peer_smollm2_lora.py [cpu|cuda] [steps]   (pip install transformers peft gguf)
"""
import os, pathlib, sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from peer_support import time_and_report, train_step

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
torch.manual_seed(0)
gguf = pathlib.Path(os.environ["REFIT_SMOLLM2_GGUF"])
base = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=targets)).to(dev)
model.train()
lora = [p for p in model.parameters() if p.requires_grad]
assert all(p.dtype == torch.float32 for p in lora)
opt = torch.optim.AdamW(lora, lr=1e-3, weight_decay=0.0)
ids = torch.randint(100, 49000, (2, 256), device=dev)


def compute_loss():
    with torch.autocast(dev, dtype=torch.bfloat16):
        return model(input_ids=ids, labels=ids).loss


time_and_report(train_step(compute_loss, lora, opt), dev, steps, 3, lora)
