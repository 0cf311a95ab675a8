"""Golden FLOP counts of one training micro-batch (forward and backward, no optimizer step) of the
quickstart and of recipes/text/minilm-lora-bf16.json, counted by PyTorch's own FlopCounterMode
(torch.utils.flop_counter) on the Python peers of refit's benchmarks: transformers + PEFT, the
frozen backbone in bf16 under bf16 autocast, LoRA r=8 in fp32 (bench/peer_support.py and
bench/peer_minilm_lora.py). refit's perf::FlopCounter must count the same step to the FLOP
(tests/unit/test_step_flops.cpp).

The frozen-layer rule needs no adjustment here: autograd on the peer, as in refit, runs a frozen
layer's forward and its input gradient only (2F), a trainable one's weight gradient too (3F), and
nothing backward of the first layer whose input needs no gradient (the patch embedding, the word
embeddings). FlopCounterMode's only gap on a CPU is scaled-dot-product attention's flash kernel
for the CPU, which it does not map: it is mapped below to the very formulas FlopCounterMode uses
for the CUDA flash kernel (sdpa_flop_count, sdpa_backward_flop_count).

MiniLM's batches are padded to their longest record, so its count is given for every length
3..64 (the recipe's max_length); the quickstart's images are always 28x28.

Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_step_flops.py   (REFIT_MINILM_DIR set,
scripts/env.sh). Writes tests/golden/flops/step_flops.json.
"""
import json, os, pathlib, sys

import pinned

pinned.require(__file__, {"torch": "2.11.0", "transformers": "5.24.0", "peft": "0.21.2"})

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count, sdpa_backward_flop_count

root = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "bench"))
from peer_support import quickstart_vit_with_lora  # noqa: E402

aten = torch.ops.aten


def cpu_flash(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def cpu_flash_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


MAPPING = {aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash,
           aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_flash_backward}


def count(forward):
    """FLOPs of forward() and of the backward of what it returns, each with its total by operator."""
    result = {}
    with FlopCounterMode(display=False, custom_mapping=MAPPING) as mode:
        loss = forward()
    result["forward"] = mode.get_total_flops()
    result["forward_by_operator"] = {str(k): v for k, v in mode.get_flop_counts()["Global"].items()}
    with FlopCounterMode(display=False, custom_mapping=MAPPING) as mode:
        loss.backward()
    result["backward"] = mode.get_total_flops()
    result["backward_by_operator"] = {str(k): v for k, v in mode.get_flop_counts()["Global"].items()}
    return result


def quickstart():
    torch.manual_seed(0)
    model, head = quickstart_vit_with_lora(root, "cpu")
    model.train()
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 5, (64,))

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head(model(pixel_values=x).pooler_output)
        return torch.nn.functional.cross_entropy(logits.float(), y)
    return dict(batch=64, **count(forward))


def minilm():
    from peft import LoraConfig, get_peft_model
    from transformers import BertModel
    torch.manual_seed(0)
    backbone = BertModel.from_pretrained(os.environ["REFIT_MINILM_DIR"], attn_implementation="sdpa").to(torch.bfloat16)
    targets = r"encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)"
    model = get_peft_model(backbone, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    head = torch.nn.Linear(384, 6)
    model.train()
    by_length = {}
    for length in range(3, 65):
        ids = torch.randint(1000, 30000, (32, length))
        mask = torch.ones_like(ids)
        mask[1:, length // 2:] = 0  # padded records, as in a real batch: the count must not depend on the mask
        y = torch.randint(0, 6, (32,))

        def forward():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                states = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
                m = mask.unsqueeze(-1).float()
                pooled = torch.nn.functional.normalize((states.float() * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1)
                logits = head(pooled)
            return torch.nn.functional.cross_entropy(logits.float(), y)
        by_length[str(length)] = count(forward)
    return dict(batch=32, by_length=by_length)


out = dict(generator="tests/golden/make_step_flops.py", torch=torch.__version__,
           quickstart=quickstart(), minilm=minilm())
path = root / "tests/golden/flops/step_flops.json"
path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
q = out["quickstart"]
print("quickstart forward", q["forward"], q["forward_by_operator"])
print("quickstart backward", q["backward"], q["backward_by_operator"])
m = out["minilm"]["by_length"]["64"]
print("minilm L=64 forward", m["forward"], m["forward_by_operator"])
print("minilm L=64 backward", m["backward"], m["backward_by_operator"])
