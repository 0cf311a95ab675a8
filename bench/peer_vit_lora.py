"""Python peer of bench/vit_lora_step.cpp: the quickstart's step in eager PyTorch + HF PEFT.

transformers' Dinov2Model with the quickstart's ViT config and the shipped backbone weights,
frozen in bf16; PEFT LoRA r=8 alpha=16 on every block's query, value, attention output, fc1,
fc2 (fp32); a fp32 Linear(64, 5) head on the CLS token; bf16 autocast, AdamW lr 3e-3 (fused
where available, as refit), clip 1.0; one fixed batch of 64 28x28 images. Prints JSON.
Usage: python bench/peer_vit_lora.py [cpu|cuda] [steps]   (pip install transformers peft)
"""
import pathlib, sys

import torch
from peer_support import quickstart_vit_with_lora, time_and_report, train_step

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
root = pathlib.Path(__file__).resolve().parent.parent
torch.manual_seed(0)
model, head = quickstart_vit_with_lora(root, dev)
params = [p for p in list(model.parameters()) + list(head.parameters()) if p.requires_grad]
assert all(p.dtype == torch.float32 for p in params)
opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0, fused=True)
x = torch.randn(64, 1, 28, 28, device=dev)
y = torch.randint(0, 5, (64,), device=dev)


def compute_loss():
    with torch.autocast(dev, dtype=torch.bfloat16):
        logits = head(model(pixel_values=x).pooler_output)
    return torch.nn.functional.cross_entropy(logits.float(), y)


time_and_report(train_step(compute_loss, params, opt), dev, steps, 10, params)
