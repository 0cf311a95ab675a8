"""Golden data for refit's quantized weight formats (include/refit/quantized.h): bitsandbytes'
CPU functions on real weights.

Weights (each as the model stores it, float32):
  minilm   all-MiniLM-L6-v2 encoder.layer.0.attention.self.query.weight [384, 384] ($REFIT_MINILM_DIR)
  vit      the quickstart ViT's encoder.layer.0.attention.attention.query.weight
           (recipes/fashion-mnist/vit-backbone.safetensors)
  smollm2  SmolLM2-135M-Instruct model.layers.0.self_attn.k_proj.weight [192, 576], as transformers
           dequantizes it from the GGUF file ($REFIT_SMOLLM2_GGUF)
  odd      40 values (not a multiple of the block of 64: the last block is short), seeded normal
For each, with bitsandbytes.functional (the input and the dequantized values are stored for the
small ones, vit and odd, only):
  <w>.weight                     the input
  <w>.nf4.packed [n/2] uint8     quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
  <w>.nf4.absmax [blocks] f32
  <w>.nf4.dequantized f32        dequantize_4bit of the same (float32)
  <w>.nf4dq.absmax [blocks] uint8, .absmax_scale [ceil(blocks/256)] f32, .offset [] f32
                                 compress_statistics=True (double quantization: absmax - mean in
                                 blocks of 256 with the signed dynamic 8-bit map)
  <w>.nf4dq.dequantized f32
  <w>.int8.weight [rows, cols] int8, .scale [rows] f32   int8_vectorwise_quant (row-wise absmax / 127)
  <w>.int8.dequantized f32       int8_vectorwise_dequant
and the tables: nf4_code [16] f32, dynamic_code [256] f32 (create_dynamic_map(signed=True)).
Run: source scripts/env.sh; ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_quantized.py
"""

PINNED = {"torch": "2.11.0", "bitsandbytes": "0.50.2", "transformers": "5.24.0", "safetensors": "0.8.0",
          "gguf": "0.19.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import os
import pathlib

import bitsandbytes
import bitsandbytes.functional as F
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

root = pathlib.Path(__file__).resolve().parent.parent.parent
out_file = root / "tests/golden/quantized.safetensors"

minilm = load_file(str(pathlib.Path(os.environ["REFIT_MINILM_DIR"]) / "model.safetensors"))
vit = load_file(str(root / "recipes/fashion-mnist/vit-backbone.safetensors"))
gguf = pathlib.Path(os.environ["REFIT_SMOLLM2_GGUF"])
lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
weights = {
    "minilm": minilm["encoder.layer.0.attention.self.query.weight"].float(),
    "vit": vit["encoder.layer.0.attention.attention.query.weight"].float(),
    "smollm2": lm.state_dict()["model.layers.0.self_attn.k_proj.weight"].float(),
    "odd": torch.randn(40, generator=torch.Generator().manual_seed(3)),
}
out = {"nf4_code": F.get_4bit_type("nf4", device="cpu"), "dynamic_code": F.create_dynamic_map(signed=True)}
for name, w in weights.items():
    w = w.contiguous()
    small = w.numel() <= 4096  # the others' weights and dequantized values are not stored (refit reads the sources)
    if small:
        out[f"{name}.weight"] = w
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    out[f"{name}.nf4.packed"] = packed.reshape(-1)
    out[f"{name}.nf4.absmax"] = state.absmax
    dequantized = F.dequantize_4bit(packed, state).float()
    if small:
        out[f"{name}.nf4.dequantized"] = dequantized
    packed2, state2 = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    assert torch.equal(packed2, packed)
    assert state2.state2.blocksize == 256
    out[f"{name}.nf4dq.absmax"] = state2.absmax
    out[f"{name}.nf4dq.absmax_scale"] = state2.state2.absmax
    out[f"{name}.nf4dq.offset"] = state2.offset.reshape([])
    if small:
        out[f"{name}.nf4dq.dequantized"] = F.dequantize_4bit(packed2, state2).float()
    if w.dim() == 2:
        cb, scb, _ = F.int8_vectorwise_quant(w.clone())
        out[f"{name}.int8.weight"] = cb
        out[f"{name}.int8.scale"] = scb
        if small:
            out[f"{name}.int8.dequantized"] = F.int8_vectorwise_dequant(cb, scb).float()
    print(name, list(w.shape), "nf4 max error", (dequantized - w).abs().max().item())
out = {k: v.contiguous() for k, v in out.items()}
save_file(out, str(out_file), metadata={"bitsandbytes": bitsandbytes.__version__, "torch": torch.__version__})
print("wrote", out_file, out_file.stat().st_size, "bytes")
