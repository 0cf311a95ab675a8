"""Golden data for the loop's optimizer path: AdamW + linear-warmup cosine schedule, and
gradient accumulation, computed by Python PyTorch. Writes adamw_cosine.safetensors.

Model: Linear(6, 4) (weight "fc.weight", bias "fc.bias"), cross entropy (mean over the batch).
Data: X [80, 6], y [80], taken in order (no shuffle).

Scenario "cosine": 50 AdamW steps on batches of 8 (data cycled), lr(k) = base * f(k) with
f(k) = k / W for k < W, else 0.5 * (1 + cos(pi * (k - W) / (T - W))), W = 5, T = 50
(HF transformers' get_cosine_schedule_with_warmup, as refit documents).
Scenario "accumulate": one big batch per update — batches of 32, 32, 16 (= refit's 10
micro-batches of 8 with gradient_accumulation 4: two full windows and a partial one).
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_adamw_cosine.py
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import math
import pathlib

import torch
from safetensors.torch import save_file

torch.manual_seed(1234)
X = torch.randn(80, 6)
y = torch.randint(0, 4, (80,))
init = torch.nn.Linear(6, 4)
init_w, init_b = init.weight.detach().clone(), init.bias.detach().clone()
hp = dict(lr=0.01, betas=(0.9, 0.98), eps=1e-7, weight_decay=0.05)


def fresh():
    m = torch.nn.Linear(6, 4)
    with torch.no_grad():
        m.weight.copy_(init_w)
        m.bias.copy_(init_b)
    return m


# cosine
W, T = 5, 50
m = fresh()
opt = torch.optim.AdamW(m.parameters(), **hp)
f = lambda k: k / W if k < W else 0.5 * (1 + math.cos(math.pi * (k - W) / (T - W)))
sched = torch.optim.lr_scheduler.LambdaLR(opt, f)
losses, lrs = [], []
for k in range(T):
    i = (k * 8) % 80
    loss = torch.nn.functional.cross_entropy(m(X[i:i + 8]), y[i:i + 8])
    lrs.append(opt.param_groups[0]["lr"])
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(loss.item())
cos_w, cos_b = m.weight.detach().clone(), m.bias.detach().clone()

# accumulate
m = fresh()
opt = torch.optim.AdamW(m.parameters(), **hp)
for lo, hi in [(0, 32), (32, 64), (64, 80)]:
    torch.nn.functional.cross_entropy(m(X[lo:hi]), y[lo:hi]).backward()
    opt.step()
    opt.zero_grad()
acc_w, acc_b = m.weight.detach().clone(), m.bias.detach().clone()

out = pathlib.Path(__file__).parent / "adamw_cosine.safetensors"
save_file({
    "X": X, "y": y, "init.fc.weight": init_w, "init.fc.bias": init_b,
    "cosine.fc.weight": cos_w, "cosine.fc.bias": cos_b,
    "cosine.losses": torch.tensor(losses, dtype=torch.float64), "cosine.lrs": torch.tensor(lrs, dtype=torch.float64),
    "accumulate.fc.weight": acc_w, "accumulate.fc.bias": acc_b,
}, str(out), metadata={"torch": torch.__version__, **{k: str(v) for k, v in hp.items()}})
print(out, out.stat().st_size, "bytes; final loss", losses[-1])
