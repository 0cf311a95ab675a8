"""Golden data for the device-side skip: torch.amp.GradScaler with a fused AdamW (the optimizer
gets found_inf from scaler.step and skips inside its kernel, then puts the step count back), on a
fixed stream of gradients with inf/NaN injected at chosen steps. Writes
fused_adamw_skip.safetensors: per step the unscaled grads, and the parameters and step count
after the step. Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_fused_adamw_skip.py
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import pathlib

import torch
from safetensors.torch import save_file

torch.manual_seed(0)
params = [torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2, 2))]
opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05, fused=True)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
inject = {2: (0, 1, float("inf")), 5: (1, 3, float("nan")), 6: (0, 0, float("-inf"))}
out = {"param0_initial": params[0].detach().clone(), "param1_initial": params[1].detach().clone()}
for i in range(10):
    grads = [torch.randn_like(p) for p in params]
    if i in inject:
        which, index, value = inject[i]
        grads[which].view(-1)[index] = value
    scaler.scale(torch.zeros(()))
    scale = scaler.get_scale()
    for p, g in zip(params, grads):
        p.grad = g * scale
    scaler.unscale_(opt)
    scaler.step(opt)  # fused: found_inf goes to the kernel
    scaler.update()
    opt.zero_grad(set_to_none=True)
    for j, g in enumerate(grads):
        out[f"step{i}_grad{j}"] = g
    for j, p in enumerate(params):
        out[f"step{i}_param{j}"] = p.detach().clone()
    out[f"step{i}_count"] = opt.state[params[0]]["step"].detach().clone().reshape(1).double()
    out[f"step{i}_scale"] = torch.tensor([scale], dtype=torch.float64)
path = pathlib.Path(__file__).parent / "fused_adamw_skip.safetensors"
save_file({k: v.contiguous() for k, v in out.items()}, str(path), metadata={"torch": torch.__version__})
print(path, [out[f"step{i}_count"].item() for i in range(10)])
