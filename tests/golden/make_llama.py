"""Golden data for refit's `llama` model (plugin "llm"): two tiny random decoder LMs built by
transformers, their weights, and what transformers computes on one batch padded on the right
and the same batch padded on the left (llm.c's test_gpt2.c, for Llama).

  tiny_llama/   LlamaForCausalLM: 2 layers, hidden 64, 4 heads / 2 KV heads (GQA), FFN 160,
                vocab 256, tied embeddings, rope theta 10000 with the `llama3` scaling (factor 8,
                low/high_freq_factor 1/4, original_max_position_embeddings 64: head_dim 16 gives
                wavelengths on both sides of, and between, 16 and 64, so every branch is used),
                pad_token_id 0 (the embedding's padding_idx: its row gets no gradient)
  tiny_qwen2/   Qwen2ForCausalLM: 1 layer, hidden 32, 2 heads / 1 KV head, FFN 64, vocab 128,
                q/k/v biases (Qwen2's), an untied lm_head, rope theta 1e6, rms eps 1e-5

Each folder holds config.json + model.safetensors (fp32, as transformers saves them) and
golden.safetensors:
  input_ids_right, attention_mask_right, input_ids_left, attention_mask_left    [3, 10] int64
  position_ids_left   cumsum(mask) - 1, padding at 1 (what transformers' generate passes)
  logits_right, logits_left          [3, 10, V] float32 (sdpa, eval)
  logits64_right, logits64_left      [3, 10, V] float64 (the same model in double; sdpa too: eager
                                     attention in double turns the fully masked padding rows into NaN)
  loss_right, loss_left (float32): mean cross-entropy of the shifted labels (input_ids, -100 on
                                     padding), transformers' own loss; loss64_right (float64): the same
                                     from the float64 logits, in double (transformers' loss casts to float32)
  grad.<parameter name>              float32 gradient of loss_right, every parameter
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_llama.py
"""

PINNED = {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import copy
import pathlib

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

here = pathlib.Path(__file__).parent / "llama"
lengths = [10, 7, 4]
T = max(lengths)


def batches(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, vocab, (n,), generator=g) for n in lengths]  # 0 is the padding id
    out = {}
    for side in ("right", "left"):
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        mask = torch.zeros(len(rows), T, dtype=torch.long)
        for i, r in enumerate(rows):
            s = slice(0, len(r)) if side == "right" else slice(T - len(r), T)
            ids[i, s] = r
            mask[i, s] = 1
        out[side] = (ids, mask)
    return out


def labels_of(ids, mask):
    return ids.masked_fill(mask == 0, -100)


def make(name, model, vocab, seed):
    folder = here / name
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    data = batches(vocab, seed)
    tensors = {}
    ids_l, mask_l = data["left"]
    pos_l = (mask_l.cumsum(-1) - 1).masked_fill(mask_l == 0, 1)
    tensors["position_ids_left"] = pos_l
    double = copy.deepcopy(model).double()
    for side in ("right", "left"):
        ids, mask = data[side]
        tensors[f"input_ids_{side}"] = ids
        tensors[f"attention_mask_{side}"] = mask
        pos = pos_l if side == "left" else None
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels_of(ids, mask))
        tensors[f"logits_{side}"] = out.logits.detach().contiguous()
        tensors[f"loss_{side}"] = out.loss.detach().reshape(1)
        # transformers' loss is the mean over target tokens of the shifted labels: checked here.
        shifted = labels_of(ids, mask)[:, 1:]
        manual = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, vocab), shifted.reshape(-1))
        assert torch.allclose(manual, out.loss), (manual, out.loss)
        if side == "right":
            out.loss.backward()
            for n, p in model.named_parameters():
                tensors["grad." + n] = p.grad.detach().clone().contiguous()
        with torch.no_grad():
            o64 = double(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels_of(ids, mask))
        tensors[f"logits64_{side}"] = o64.logits.contiguous()
        if side == "right":
            # transformers' loss casts the logits to float32 first; the double reference is computed here.
            shifted = labels_of(ids, mask)[:, 1:].reshape(-1)
            tensors["loss64_right"] = torch.nn.functional.cross_entropy(o64.logits[:, :-1].reshape(-1, vocab), shifted).reshape(1)
    # The same sequences padded either way give the same logits at the real tokens.
    real_r, real_l = data["right"][1].bool(), data["left"][1].bool()
    d = (tensors["logits64_right"][real_r] - tensors["logits64_left"][real_l]).abs().max().item()
    print(name, "left vs right padding, real tokens, float64 max abs diff:", d)
    assert d < 1e-12
    names = [n for n, _ in model.named_parameters()]
    print(name, "parameters:", len(names), names[:3], "...")
    save_file(tensors, str(folder / "golden.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    print("wrote", folder)


torch.manual_seed(33)
llama = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                    eos_token_id=2, initializer_range=0.1,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 64})
m = LlamaForCausalLM(llama).eval()
with torch.no_grad():  # non-trivial norm weights (transformers initialises them to one)
    for n, p in m.named_parameters():
        if n.endswith("norm.weight"):
            p.copy_(1 + 0.2 * torch.randn_like(p))
make("tiny_llama", m, 256, 1)

torch.manual_seed(34)
qwen = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                   rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.1,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                   use_sliding_window=False)
q = Qwen2ForCausalLM(qwen).eval()
with torch.no_grad():
    for n, p in q.named_parameters():
        if n.endswith("norm.weight"):
            p.copy_(1 + 0.2 * torch.randn_like(p))
        if n.endswith(".bias"):
            p.copy_(0.1 * torch.randn_like(p))
make("tiny_qwen2", q, 128, 2)
