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


def quickstart_vit_with_lora(root, dev):
    """The quickstart's model in transformers + PEFT: Dinov2Model with the quickstart's ViT config
    and the shipped backbone weights (recipes/fashion-mnist/vit-backbone.safetensors), frozen in
    bf16; PEFT LoRA r=8 alpha=16 on every block's query, value, attention output, fc1, fc2 (fp32);
    a fp32 Linear(64, 5) head. Returns (model, head) on `dev`."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import Dinov2Config, Dinov2Model

    backbone = Dinov2Model(Dinov2Config(image_size=28, patch_size=4, num_channels=1, hidden_size=64,
                                        num_hidden_layers=4, num_attention_heads=4, mlp_ratio=2, layerscale_value=1.0))
    # The file has the checkpoint names (as refit); transformers >= 5 renames on from_pretrained only.
    rename = {"attention.attention.query": "attention.q_proj", "attention.attention.key": "attention.k_proj",
              "attention.attention.value": "attention.v_proj", "attention.output.dense": "attention.o_proj"}
    state = {}
    for k, v in load_file(str(root / "recipes/fashion-mnist/vit-backbone.safetensors")).items():
        for a, b in rename.items():
            k = k.replace(a, b)
        state[k] = v
    backbone.load_state_dict(state, strict=True)
    backbone = backbone.to(torch.bfloat16)
    # transformers >= 5 names the attention projections q_proj/v_proj/o_proj in memory.
    targets = r"encoder\.layer\.\d+\.(attention\.(q_proj|v_proj|o_proj)|mlp\.fc[12])"
    model = get_peft_model(backbone, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    return model.to(dev), torch.nn.Linear(64, 5).to(dev)
