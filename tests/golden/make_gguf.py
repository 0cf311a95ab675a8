#!/usr/bin/env python3
"""Writes the GGUF fixtures of tests/unit/test_gguf.cpp and tests/unit/test_gguf_weights.cpp
into tests/golden/gguf/, with gguf-py's own writer and (de)quantizer (the code llama.cpp's
converter and transformers' GGUF loader use):

  types.gguf, types.json   every metadata value type (scalars and arrays), a custom alignment,
                           and F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors (quantized from data with
                           gguf.quants.quantize, and raw blocks of random bytes), 1 to 4
                           dimensions; a Q4_K tensor the reader must refuse by name. The JSON
                           holds every metadata value and each tensor's dequantized values
                           (gguf.quants.dequantize) as float32 bit patterns, and their bfloat16
                           bit patterns as torch rounds them.
  tiny_llama.gguf, tiny_llama_tied.gguf, tiny_qwen2.gguf
                           2-layer llama / qwen2 models (4 heads, 2 KV heads), written as
                           llama.cpp's converter writes them (q/k rows permuted for llama, not
                           for qwen2); tiny_*.expected.safetensors: transformers' state dict of
                           the same file (AutoModelForCausalLM.from_pretrained(gguf_file=...),
                           fp32), which refit's load_weights must reproduce exactly.
  smollm2.json             reference values of the real SmolLM2-135M-Instruct.Q4_1.gguf
                           ($REFIT_SMOLLM2_GGUF, scripts/env.sh): for every tensor the CRC-32 of
                           its dequantized float32 bytes and of its bfloat16 bytes, its sum and
                           sum of squares (math.fsum: exactly rounded), and sampled elements of a
                           few; layer 0's q/k projections after transformers' reverse permutation.

    source scripts/env.sh
    ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_gguf.py
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"gguf": "0.19.0", "numpy": "2.4.6", "torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import math
import os
import pathlib
import tempfile
import zlib

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from safetensors.torch import save_file

OUT = pathlib.Path(__file__).resolve().parent / "gguf"
rng = np.random.default_rng(33)


def f32_bits(a):
    return [int(x) for x in np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)]


def bf16_bits(a):
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
    return [int(x) for x in t.reshape(-1).view(torch.int16).numpy().astype(np.uint16)]


def crc(a):
    return zlib.crc32(np.ascontiguousarray(a).tobytes())


def bf16_crc(a):
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
    return zlib.crc32(t.view(torch.int16).numpy().tobytes())


# ---- types.gguf ------------------------------------------------------------------------------
def write_types():
    w = gguf.GGUFWriter(OUT / "types.gguf", arch="test")
    w.add_custom_alignment(64)
    meta = {}

    def kv(key, val, vtype, sub=None, expect=None):
        w.add_key_value(key, val, vtype, sub)
        meta[key] = {"type": vtype.name, "element_type": sub.name if sub is not None else None,
                     "value": expect if expect is not None else val}

    kv("t.u8", 200, V.UINT8)
    kv("t.i8", -100, V.INT8)
    kv("t.u16", 60000, V.UINT16)
    kv("t.i16", -30000, V.INT16)
    kv("t.u32", 4000000000, V.UINT32)
    kv("t.i32", -2000000000, V.INT32)
    kv("t.u64", 18446744073709551615, V.UINT64)
    kv("t.i64", -9223372036854775808, V.INT64)
    kv("t.f32", 0.1, V.FLOAT32, expect=float(np.float32(0.1)))
    kv("t.f64", 0.1, V.FLOAT64)
    kv("t.bool.true", True, V.BOOL)
    kv("t.bool.false", False, V.BOOL)
    kv("t.string", "Grüße, 世界 🌍\n\ttabs", V.STRING)
    kv("t.string.empty", "", V.STRING)
    kv("t.a.u8", [0, 1, 255], V.ARRAY, V.UINT8)
    kv("t.a.i8", [-128, 0, 127], V.ARRAY, V.INT8)
    kv("t.a.u16", [0, 65535], V.ARRAY, V.UINT16)
    kv("t.a.i16", [-32768, 32767], V.ARRAY, V.INT16)
    kv("t.a.u32", [0, 4294967295], V.ARRAY, V.UINT32)
    kv("t.a.i32", [-2147483648, 2147483647, 5], V.ARRAY, V.INT32)
    kv("t.a.u64", [0, 9223372036854775807], V.ARRAY, V.UINT64)
    kv("t.a.i64", [-9223372036854775808, 9223372036854775807], V.ARRAY, V.INT64)
    kv("t.a.f32", [1.5, -0.1], V.ARRAY, V.FLOAT32, expect=[1.5, float(np.float32(-0.1))])
    kv("t.a.f64", [2.5, 1e300], V.ARRAY, V.FLOAT64)
    kv("t.a.bool", [True, False, True], V.ARRAY, V.BOOL)
    kv("t.a.string", ["a", "", "ünï", "x" * 300], V.ARRAY, V.STRING)

    tensors = {}

    def add(name, values, qtype, raw=None, raw_shape=None):
        """values: float32 array in torch order (quantized here), or raw packed bytes."""
        if raw is None:
            packed = gguf.quants.quantize(values, qtype)
            # A quantized (uint8) array's last axis counts bytes: gguf-py derives the element shape.
            w.add_tensor(name, packed, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)
            shape = list(values.shape)
        else:
            packed = raw
            w.add_tensor(name, raw, raw_dtype=qtype)
            shape = list(raw_shape)
        deq = gguf.quants.dequantize(packed.view(np.uint8) if qtype not in (Q.F32, Q.F16) else packed, qtype)
        deq = np.asarray(deq, dtype=np.float32).reshape(shape)
        tensors[name] = {"type": qtype.name, "shape": shape, "f32": f32_bits(deq), "bf16": bf16_bits(deq)}

    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 3.4e38, 65504.0, 6e-8, 1e-5, -2.5],
                        dtype=np.float32)
    f32 = rng.standard_normal((3, 20)).astype(np.float32)
    f32.reshape(-1)[:12] = specials
    add("f32", f32, Q.F32)
    add("f32_1d", rng.standard_normal(7).astype(np.float32), Q.F32)
    f16 = (rng.standard_normal((2, 3, 8)) * 100).astype(np.float32)
    f16.reshape(-1)[:12] = specials  # fp16 rounding: subnormal halves, overflow to inf, NaN
    add("f16", f16, Q.F16)
    add("bf16", (rng.standard_normal((4, 16)) * 3).astype(np.float32), Q.BF16)
    # BF16 raw bit patterns: every exponent, NaNs, subnormals, both zeros.
    bf16_raw = rng.integers(0, 65536, size=(2, 32), dtype=np.uint16)
    bf16_raw[0, :6] = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001]
    add("bf16_raw", None, Q.BF16, raw=bf16_raw.view(np.uint8), raw_shape=(2, 32))
    for qtype, bytes_per_block in ((Q.Q8_0, 34), (Q.Q4_0, 18), (Q.Q4_1, 20)):
        lname = qtype.name.lower()
        data = rng.standard_normal((4, 64)).astype(np.float32) * np.float32(0.05)
        data[1] += np.float32(0.3)  # a row away from zero (Q4_1's offset m)
        add(lname, data, qtype)
        # Random blocks: every nibble / int8 value, scales of every finite magnitude (fp16 d with
        # a random exponent, never inf or NaN).
        blocks = rng.integers(0, 256, size=(3 * 3, bytes_per_block), dtype=np.uint8)
        scales = rng.integers(0, 0x7C00, size=(9, 2), dtype=np.uint16) | (rng.integers(0, 2, size=(9, 2)) << 15).astype(np.uint16)
        nscale = 2 if qtype == Q.Q4_1 else 1
        blocks[:, : 2 * nscale] = scales[:, :nscale].view(np.uint8)
        add(lname + "_raw", None, qtype, raw=blocks.reshape(3, 3 * bytes_per_block), raw_shape=(3, 96))
    add("q8_0_4d", rng.standard_normal((2, 1, 3, 32)).astype(np.float32), Q.Q8_0)
    # A type refit does not dequantize: it opens, and reading it is refused by name.
    w.add_tensor("q4_k", rng.integers(0, 256, size=(1, 144), dtype=np.uint8), raw_dtype=Q.Q4_K)
    tensors["q4_k"] = {"type": "Q4_K", "shape": [1, 256]}

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta["general.architecture"] = {"type": "STRING", "element_type": None, "value": "test"}
    meta["general.alignment"] = {"type": "UINT32", "element_type": None, "value": 64}
    (OUT / "types.json").write_text(json.dumps({"metadata": meta, "tensors": tensors}, indent=None) + "\n")


# ---- tiny llama / qwen2 models ---------------------------------------------------------------
def permute(w, n_head, n_head_kv):
    # llama.cpp convert_hf_to_gguf.py, LlamaModel.permute (HF -> GGUF row order)
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny(name, arch, tied, bias):
    hidden, n_head, n_kv, ffn, vocab, layers = 32, 4, 2, 64, 40, 2
    head_dim = hidden // n_head
    path = OUT / f"{name}.gguf"
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(head_dim)
    # A minimal byte-level vocabulary, so that transformers can build the config and tokenizer.
    tokens = [f"t{i}" for i in range(vocab)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * vocab)
    w.add_token_merges(["t 1"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def lin(rows, cols):
        return (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)

    def add(gname, values, qtype):
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(gname, gguf.quants.quantize(values, qtype))
        else:
            w.add_tensor(gname, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    permutes = arch == "llama"
    add("token_embd.weight", lin(vocab, hidden), Q.Q8_0)
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), Q.F32)
        q, k = lin(n_head * head_dim, hidden), lin(n_kv * head_dim, hidden)
        add(f"blk.{i}.attn_q.weight", permute(q, n_head, n_head) if permutes else q, Q.Q4_1)
        add(f"blk.{i}.attn_k.weight", permute(k, n_head, n_kv) if permutes else k, Q.Q4_0)
        add(f"blk.{i}.attn_v.weight", lin(n_kv * head_dim, hidden), Q.Q8_0)
        if bias:
            add(f"blk.{i}.attn_q.bias", (0.1 * rng.standard_normal(n_head * head_dim)).astype(np.float32), Q.F32)
            add(f"blk.{i}.attn_k.bias", (0.1 * rng.standard_normal(n_kv * head_dim)).astype(np.float32), Q.F32)
            add(f"blk.{i}.attn_v.bias", (0.1 * rng.standard_normal(n_kv * head_dim)).astype(np.float32), Q.F32)
        add(f"blk.{i}.attn_output.weight", lin(hidden, hidden), Q.Q4_1)
        add(f"blk.{i}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), Q.F32)
        add(f"blk.{i}.ffn_gate.weight", lin(ffn, hidden), Q.Q4_1)
        add(f"blk.{i}.ffn_up.weight", lin(ffn, hidden), Q.F16)
        add(f"blk.{i}.ffn_down.weight", lin(hidden, ffn), Q.BF16)
    add("output_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), Q.F32)
    if not tied:
        add("output.weight", lin(vocab, hidden), Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # transformers' own reading of the same file: the names and values refit must produce.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(OUT, gguf_file=path.name, dtype=torch.float32)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if tied:
        assert model.config.tie_word_embeddings
        state.pop("lm_head.weight", None)  # the same tensor as model.embed_tokens.weight
    save_file(state, OUT / f"{name}.expected.safetensors")


# ---- SmolLM2 reference values ----------------------------------------------------------------
def write_smollm2():
    path = os.environ.get("REFIT_SMOLLM2_GGUF")
    if not path:
        raise SystemExit("REFIT_SMOLLM2_GGUF is not set: source scripts/env.sh")
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    reader = gguf.GGUFReader(path)
    n_head = int(reader.fields["llama.attention.head_count"].contents())
    n_kv = int(reader.fields["llama.attention.head_count_kv"].contents())
    processor = LlamaTensorProcessor(config={"num_attention_heads": n_head, "num_key_value_heads": n_kv})
    sampled = {"token_embd.weight", "blk.0.ffn_down.weight", "blk.7.attn_v.weight", "output_norm.weight",
               "blk.0.attn_q.weight"}
    out = {"file": os.path.basename(path), "size": os.path.getsize(path), "tensors": {}, "unpermuted": {}}
    for t in reader.tensors:
        deq = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = list(deq.shape)
        flat = deq.reshape(-1).astype(np.float64)
        entry = {"type": t.tensor_type.name, "shape": shape, "crc32_f32": crc(deq), "crc32_bf16": bf16_crc(deq),
                 "sum": math.fsum(flat), "sum_sq": math.fsum(flat * flat)}
        if t.name in sampled:
            idx = np.sort(rng.choice(deq.size, size=min(300, deq.size), replace=False))
            entry["samples"] = [[int(i), b] for i, b in zip(idx, f32_bits(deq.reshape(-1)[idx]))]
        out["tensors"][t.name] = entry
        if t.name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight"):
            un = processor.process(weights=deq, name=t.name).weights
            un = np.ascontiguousarray(un, dtype=np.float32)
            idx = np.sort(rng.choice(un.size, size=300, replace=False))
            out["unpermuted"][t.name] = {"crc32_f32": crc(un), "samples": [[int(i), b] for i, b in zip(idx, f32_bits(un.reshape(-1)[idx]))]}
    (OUT / "smollm2.json").write_text(json.dumps(out, indent=None) + "\n")


OUT.mkdir(exist_ok=True)
write_types()
write_tiny("tiny_llama", "llama", tied=False, bias=False)
write_tiny("tiny_llama_tied", "llama", tied=True, bias=False)
write_tiny("tiny_qwen2", "qwen2", tied=False, bias=True)
write_smollm2()
print("wrote", ", ".join(sorted(p.name for p in OUT.iterdir())))
