"""What the Python peers of refit's benchmarks share: the training step of a loss function
(backward, clip 1.0, optimizer step, zero_grad), and its timing after a warm-up, printed as the
one JSON line bench/compare.py reads."""
import json
import time

import torch


def train_step(compute_loss, params, opt):
    """One step: loss.backward(), clip_grad_norm_(params, 1.0), opt.step(), zero_grad."""
    def step():
        loss = compute_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def time_and_report(step, dev, steps, warmup, params, impl="python-eager-peft", **extra):
    """Runs `warmup` then `steps` steps, prints {impl, device, ms_per_step, trainable, loss, **extra}.
    On CUDA the peak memory of the timed steps is reported as peak_gib."""
    for _ in range(warmup):
        step()
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    if dev == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    result = dict(impl=impl, device=dev, ms_per_step=round(seconds * 1e3, 3),
                  trainable=sum(p.numel() for p in params), loss=float(loss.detach()), **extra)
    if dev == "cuda":
        result["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(result), flush=True)
    return seconds
