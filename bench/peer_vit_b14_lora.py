"""Python peer of bench/vit_b14_lora.cpp: ViT-B/14 LoRA fine-tuning of a frozen bf16 backbone in
eager PyTorch + timm + HF PEFT (optionally under torch.compile).

timm's vit_base_patch14_dinov2 (the DINOv2-B architecture: 12 x 768, 12 heads, MLP 3072,
patch 14; random weights: the step's cost does not depend on them) at 224 px, batch 128, cast to
bf16 and frozen; PEFT LoRA r=16 alpha=16 (fp32) on every block's attn.qkv, attn.proj, mlp.fc1,
mlp.fc2 (timm fuses q, k, v into one qkv projection, so this LoRA has one factor pair where
refit's has three); a fp32 Linear(768, 100) head on the pooled token; bf16 autocast, fused AdamW
lr 1e-4, clip 1.0, TF32 off; one fixed batch (bf16 images) kept on the device.
Prints one JSON line (bench/peer_support.py), with peak_gib on CUDA.
Usage: python bench/peer_vit_b14_lora.py [cpu|cuda] [steps] [batch] [image_size] [eager|compile]
       (pip install timm peft; cpu: a smoke run at small sizes, e.g. cpu 2 2 56)
"""
import sys

import timm
import torch
import torch.nn as nn
from peft import LoraConfig, get_peft_model

from peer_support import time_and_report, train_step

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 128
image = int(sys.argv[4]) if len(sys.argv) > 4 else 224
mode = sys.argv[5] if len(sys.argv) > 5 else "eager"
if mode not in ("eager", "compile"):
    sys.exit(f"mode must be eager or compile, got {mode!r}")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self, backbone, classes=100):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.num_features, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


backbone = timm.create_model("vit_base_patch14_dinov2", pretrained=False, img_size=image, num_classes=0)
backbone = backbone.to(dev, dtype=torch.bfloat16)
config = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0,
                    target_modules=r"blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)")
net = Net(get_peft_model(backbone, config)).to(dev)
for name, p in net.backbone.named_parameters():
    if "lora_" in name:
        p.data = p.data.float()
params = [p for p in net.parameters() if p.requires_grad]
assert all(p.dtype == torch.float32 for p in params)
opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
x = torch.randn(batch, 3, image, image, device=dev, dtype=torch.bfloat16)
y = torch.randint(0, 100, (batch,), device=dev)
forward = torch.compile(net) if mode == "compile" else net


def compute_loss():
    with torch.autocast(dev, dtype=torch.bfloat16):
        return nn.functional.cross_entropy(forward(x).float(), y)


time_and_report(train_step(compute_loss, params, opt), dev, steps, 10 if dev == "cuda" else 1, params,
                          impl=f"python-{mode}-peft-timm", batch=batch, image_size=image)
