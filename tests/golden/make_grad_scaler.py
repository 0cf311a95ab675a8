"""Golden data for refit's GradScaler: torch.amp.GradScaler on a fixed stream of gradients with
inf/NaN injected at chosen steps. Writes grad_scaler.json.

Each step: grads g (unscaled) are given; as backward of the scaled loss would, p.grad = g * scale;
then scaler.unscale_(opt), scaler.step(opt), scaler.update(). Recorded per step: the scale used,
found_inf, the scale and growth tracker after update, and whether the optimizer step ran.
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_grad_scaler.py
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import math
import pathlib

import torch

torch.manual_seed(0)
params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
opt = torch.optim.SGD(params, lr=0.1)
options = dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
scaler = torch.amp.GradScaler("cpu", **options)
inject = {4: ("inf", 0, 1), 8: ("nan", 1, 3), 9: ("inf", 0, 0), 15: ("-inf", 1, 0)}


def enc(x):
    return x if math.isfinite(x) else str(x)


steps = []
for i in range(20):
    grads = [torch.randn_like(p) * 10 for p in params]
    if i in inject:
        kind, which, index = inject[i]
        grads[which].view(-1)[index] = float(kind)
    scaler.scale(torch.zeros(()))  # lazily initialises the scale, as scaler.scale(loss) would
    scale = scaler.get_scale()
    for p, g in zip(params, grads):
        p.grad = g * scale
    scaler.unscale_(opt)
    found_inf = sum(v.item() for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values())
    before = [p.detach().clone() for p in params]
    scaler.step(opt)
    stepped = any(not torch.equal(b, p) for b, p in zip(before, params))
    unscaled = [p.grad.detach().clone() for p in params]
    scaler.update()
    opt.zero_grad()
    steps.append({
        "grads": [[enc(v) for v in g.view(-1).tolist()] for g in grads],
        "shapes": [list(g.shape) for g in grads],
        "scale": scale,
        "found_inf": found_inf,
        "unscaled": [[enc(v) for v in g.view(-1).tolist()] for g in unscaled],
        "scale_after": scaler.get_scale(),
        "growth_tracker_after": int(scaler._growth_tracker.item()),
        "stepped": stepped,
    })

out = pathlib.Path(__file__).parent / "grad_scaler.json"
out.write_text(json.dumps({"torch": torch.__version__, "options": options, "steps": steps}, indent=1))
print(out, [s["scale_after"] for s in steps])
