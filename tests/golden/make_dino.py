"""Golden values for the dino plugin and the EMA update, from the reference Python.

DINOLoss, DINOHead and cosine_scheduler are copied from facebookresearch/dino (main_dino.py,
vision_transformer.py, utils.py; Apache-2.0), with the distributed all-reduce removed (one
process) and the teacher temperature schedule indexed by iteration instead of epoch, as refit
counts it. Run with the project's venv:  ~/.cache/refit/torch-2.11.0/bin/python make_dino.py
Writes dino/dino.safetensors (a few KiB). tests/unit/test_dino.cpp reads it.
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "numpy": "2.4.6", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file


class DINOLoss(nn.Module):
    def __init__(self, out_dim, ncrops, warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs, nepochs,
                 student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.ncrops = ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_temp_schedule = np.concatenate((
            np.linspace(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp))

    def forward(self, student_output, teacher_output, epoch):
        student_out = student_output / self.student_temp
        student_out = student_out.chunk(self.ncrops)
        temp = self.teacher_temp_schedule[epoch]
        teacher_out = F.softmax((teacher_output - self.center) / temp, dim=-1)
        teacher_out = teacher_out.detach().chunk(2)
        total_loss = 0
        n_loss_terms = 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
                total_loss += loss.mean()
                n_loss_terms += 1
        total_loss /= n_loss_terms
        self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)
        batch_center = batch_center / len(teacher_output)
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


class DINOHead(nn.Module):
    def __init__(self, in_dim, out_dim, norm_last_layer=True, nlayers=3, hidden_dim=2048, bottleneck_dim=256):
        super().__init__()
        layers = [nn.Linear(in_dim, hidden_dim), nn.GELU()]
        for _ in range(nlayers - 2):
            layers += [nn.Linear(hidden_dim, hidden_dim), nn.GELU()]
        layers.append(nn.Linear(hidden_dim, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        self.last_layer = nn.utils.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.last_layer.weight_g.data.fill_(1)
        if norm_last_layer:
            self.last_layer.weight_g.requires_grad = False

    def forward(self, x):
        x = self.mlp(x)
        x = F.normalize(x, dim=-1, p=2)
        return self.last_layer(x)


def cosine_scheduler(base_value, final_value, epochs, niter_per_ep):
    iters = np.arange(epochs * niter_per_ep)
    return final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))


def main():
    torch.manual_seed(0)
    out = {}
    # ---- loss, centre, temperatures -------------------------------------------------------
    views, globals_, batch, k = 4, 2, 3, 16
    iters, warmup = 12, 5
    student_views = [torch.randn(batch, k) * 0.3 for _ in range(views)]
    teacher_shift = torch.randn(k) * 0.3  # the test's teacher model: x + shift
    center0 = torch.randn(1, k) * 0.1
    loss_fn = DINOLoss(k, views, 0.04, 0.07, warmup, iters, student_temp=0.1, center_momentum=0.9)
    loss_fn.center = center0.clone()
    for i, v in enumerate(student_views):
        out[f"view{i}"] = v
    out["teacher_shift"] = teacher_shift
    out["center0"] = center0
    for step, iteration in enumerate([2, 9]):
        s = torch.cat([v.clone().requires_grad_(True) for v in student_views])
        s.retain_grad()
        t = torch.cat(student_views[:globals_]) + teacher_shift
        loss = loss_fn(s, t, iteration)
        loss.backward()
        out[f"loss{step}"] = loss.detach().reshape(1)
        out[f"grad{step}"] = s.grad  # d loss / d student output, [views * batch, k]
        out[f"center{step + 1}"] = loss_fn.center.clone()
        out[f"teacher_temp{step}"] = torch.tensor([loss_fn.teacher_temp_schedule[iteration]], dtype=torch.float64)
    # ---- EMA update (teacher = m * teacher + (1 - m) * student), cosine momentum ------------
    total = 10
    momentum = cosine_scheduler(0.996, 1.0, 1, total)
    teacher = torch.randn(5, 4)
    out["ema_teacher0"] = teacher.clone()
    skipped = [False, True, False]
    for it in range(3):
        student = torch.randn(5, 4)
        out[f"ema_student{it}"] = student
        if not skipped[it]:
            m = momentum[it]
            teacher.mul_(m).add_((1 - m) * student)
        out[f"ema_teacher{it + 1}"] = teacher.clone()
    out["ema_momentum"] = torch.tensor(momentum[:3], dtype=torch.float64)
    # ---- DINO head forward -------------------------------------------------------------
    head = DINOHead(8, 10, norm_last_layer=True, nlayers=3, hidden_dim=16, bottleneck_dim=6)
    x = torch.randn(7, 8)
    out["head_input"] = x
    out["head_output"] = head(x).detach()
    for name, value in head.state_dict().items():
        out["head/" + name] = value.detach().clone()
    here = os.path.dirname(os.path.abspath(__file__))
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(here, "dino", "dino.safetensors"),
              metadata={"producer": "tests/golden/make_dino.py", "torch": torch.__version__})


if __name__ == "__main__":
    main()
