#!/usr/bin/env python3
"""Writes a TinyLlama-1.1B-shaped Llama for the scale check (bench/scale/run.sh).

The model has TinyLlama-1.1B's shape (22 layers, hidden 2048, 32 heads / 4 key-value heads, FFN
5632, vocab 32,000, separate lm_head: 1,100,048,384 parameters) and seeded normal weights (std
0.02, norms 1), stored in bfloat16 as transformers' sharded checkpoint:

  <out>/config.json                          LlamaConfig
  <out>/model.safetensors.index.json         weight_map
  <out>/model-0000K-of-00003.safetensors     the shards (2.2 GB in all)
  <out>/tokenizer.json                       byte-level BPE: 5 special tokens, then the 256 bytes
  <out>/tokenizer_config.json                a ChatML chat template
  <out>/chats.jsonl                          64 conversations of seeded words (a step needs tokens, not meaning)

The weights are random on purpose: the check measures memory and time, not what the model knows.
They are written here, by a script, and not random-initialised by refit, so that refit's loader
has to read every tensor of a real-sized checkpoint. Needs numpy only (the torch venv has it).

    python bench/scale/make_scale_llama.py OUT_DIR
"""
import json
import os
import struct
import sys

import numpy as np

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 22, 2048, 32, 4, 5632, 32000
HEAD_DIM = HIDDEN // HEADS


def tensor_shapes():
    yield "model.embed_tokens.weight", (VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (HIDDEN,)
        yield p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)
        yield p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)
        yield p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)
        yield p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)
        yield p + "post_attention_layernorm.weight", (HIDDEN,)
        yield p + "mlp.gate_proj.weight", (FFN, HIDDEN)
        yield p + "mlp.up_proj.weight", (FFN, HIDDEN)
        yield p + "mlp.down_proj.weight", (HIDDEN, FFN)
    yield "model.norm.weight", (HIDDEN,)
    yield "lm_head.weight", (VOCAB, HIDDEN)


def bf16_bytes(values):
    """float32 -> bfloat16 bits, rounded to nearest even (what torch's .to(bfloat16) does)."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16).tobytes()


def write_shard(path, names, rng):
    header, offset = {}, 0
    for name, shape in names:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in names:  # one tensor at a time: the writer never holds the model either
            if name.endswith("norm.weight"):
                values = np.ones(shape, np.float32)
            else:
                values = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            f.write(bf16_bytes(values))
    os.replace(tmp, path)


def write_tokenizer(out):
    byte_chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [chr(c) for c in range(0xA1, 0xAD)] + \
                 [chr(c) for c in range(0xAE, 0x100)]
    bs = [ord(c) for c in byte_chars]
    cs = bs[:]
    n = 0
    for b in range(256):  # GPT-2's bytes_to_unicode
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    by_byte = dict(zip(bs, (chr(c) for c in cs)))
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for b in range(256):
        vocab[by_byte[b]] = len(vocab)
    tok = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": CHATML}, f)


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def write_chats(out):
    rng = np.random.default_rng(1)
    words = ("frozen base adapter rank gradient token memory block shard weight layer norm rotary head "
             "query key value cache step loss scale").split()
    with open(os.path.join(out, "chats.jsonl"), "w") as f:
        for _ in range(64):
            question = " ".join(rng.choice(words, 8))
            answer = " ".join(rng.choice(words, 16))
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": messages}) + "\n")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    names = list(tensor_shapes())
    shards = [names[:1 + 9 * 8], names[1 + 9 * 8:1 + 9 * 16], names[1 + 9 * 16:]]
    rng = np.random.default_rng(0)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(os.path.join(out, file), shard, rng)
        for name, shape in shard:
            weight_map[name] = file
            total += int(np.prod(shape))
        print(f"wrote {file}", flush=True)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total * 2}, "weight_map": weight_map}, f, indent=1)
    write_tokenizer(out)
    write_chats(out)
    print(f"{total:,} parameters in {out}")


if __name__ == "__main__":
    main()
