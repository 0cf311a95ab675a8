"""Python peer of bench/mlp_lora_overhead.cpp: the overhead-bound LoRA MLP step in PyTorch.

12 x [LoRA Linear 512 -> 512: frozen bf16 weight W, fp32 factors A (16 x 512) and B (512 x 16,
zero at the start), y = x W^T + (x A^T) B^T; GELU], then a trainable fp32 Linear(512, 10); batch
64, bf16 autocast, cross-entropy, AdamW lr 1e-3, clip_grad_norm_ 1.0, the same batch every step.
Three ways to run the step (the third argument):
  eager  - what users write: default AdamW (foreach) and clip_grad_norm_ (the default);
  fused  - AdamW(fused=True);
  graph  - CUDA only: the whole step (forward, backward, clip, capturable AdamW) captured once as
           a CUDA graph and replayed (PyTorch's whole-network capture), the floor of what the
           step costs once per-op dispatch is gone.
Prints one JSON line (bench/peer_support.py).
Usage: python bench/peer_mlp_lora.py [cpu|cuda] [steps] [eager|fused|graph]
"""
import sys

import torch
import torch.nn as nn

from peer_support import time_and_report, train_step


class LoraLinear(nn.Module):
    def __init__(self, width, rank, base_dtype):
        super().__init__()
        self.W = nn.Parameter((torch.randn(width, width) / width ** 0.5).to(base_dtype), requires_grad=False)
        self.A = nn.Parameter(torch.randn(rank, width) / width ** 0.5)
        self.B = nn.Parameter(torch.zeros(width, rank))

    def forward(self, x):
        f = nn.functional
        return f.linear(x, self.W) + f.linear(f.linear(x, self.A), self.B)


dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
mode = sys.argv[3] if len(sys.argv) > 3 else "eager"
if mode not in ("eager", "fused", "graph"):
    sys.exit(f"mode must be eager, fused or graph, got {mode!r}")
if mode == "graph" and dev != "cuda":
    sys.exit("graph mode needs cuda")

torch.manual_seed(0)
layers = []
for _ in range(12):
    layers += [LoraLinear(512, 16, torch.bfloat16), nn.GELU()]
net = nn.Sequential(*layers, nn.Linear(512, 10)).to(dev)
params = [p for p in net.parameters() if p.requires_grad]
options = dict(lr=1e-3)
if mode == "fused":
    options["fused"] = True
if mode == "graph":
    options.update(capturable=True, foreach=True)
opt = torch.optim.AdamW(params, **options)
x = torch.randn(64, 512, device=dev)
y = torch.randint(0, 10, (64,), device=dev)


def compute_loss(cache=True):
    # A captured step must not reuse autocast's cast cache across replays.
    with torch.autocast(dev, dtype=torch.bfloat16, cache_enabled=cache):
        return nn.functional.cross_entropy(net(x).float(), y)


if mode != "graph":
    step = train_step(compute_loss, params, opt)
else:
    def captured():
        loss = compute_loss(cache=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as torch.cuda.graph's docs ask
        for _ in range(5):
            opt.zero_grad(set_to_none=True)
            captured()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the captured backward allocates the gradients from the graph's pool
    with torch.cuda.graph(graph):
        static_loss = captured()

    def step():
        graph.replay()
        return static_loss

time_and_report(step, dev, steps, 30, params, impl="python-" + mode)
