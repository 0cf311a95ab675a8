"""Golden data for refit's "vit" model (plugins/vision/vit.cpp), produced with HF transformers.

Two tiny random models, every parameter randomised with a fixed seed (nothing is left at a
trivial 0 / 1, so LayerScale, biases, norms and the unused mask token all matter):
  dinov2/plain/      Dinov2Model               hidden 32, 2 layers, 4 heads, patch 4, image 16, qkv bias
  dinov2/registers/  Dinov2WithRegistersModel  hidden 32, 2 layers, 4 heads, patch 4, image 16,
                                               2 register tokens, no qkv bias, mlp_ratio 2, eps 1e-5
Each folder holds
  model.safetensors     written by save_pretrained: the checkpoint layout of the published
                        facebook/dinov2-* files (transformers >= 5 renames the attention projections
                        to q_proj/k_proj/v_proj/o_proj in memory, but reads and writes files with the
                        original names encoder.layer.N.attention.attention.query ... / .output.dense)
  config.json           transformers' config
  refit_config.json     the same model as a refit "vit" config
  expected.safetensors  x_<H>x<W> inputs (float32) and, for each input size and precision
                          fp32            the float32 model
                          bf16            the float32 model under torch.autocast("cpu", dtype=torch.bfloat16)
                          bf16w           the model cast to bfloat16 (model.to(torch.bfloat16)), no autocast
                          bf16w_autocast  the bfloat16 model under that autocast
                        (outputs stored as float32), and at 16x16 the model in float64 (fp64,
                        stored as float64):
                        tokens_<prec>_<H>x<W>   last_hidden_state
                        cls_<prec>_<H>x<W>      pooler_output (the normalised CLS token)
                        cls_mean_<prec>_<H>x<W> [CLS, mean of the patch tokens] (registers excluded),
                                                the input of Dinov2ForImageClassification's classifier
The 24x20 input exercises the bicubic position-embedding interpolation (6x5 patches from the 4x4
grid); 27x22 also exercises the patch convolution dropping the remainder (6x5 patches too).
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_dinov2.py  (pip install transformers)
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "transformers": "5.24.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import copy
import json
import pathlib
import shutil
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Dinov2Config, Dinov2Model, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

here = pathlib.Path(__file__).parent / "dinov2"
SIZES = [(16, 16), (24, 20), (27, 22)]


def randomise(model):
    """Every parameter random, at the scale its role expects."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("lambda1"):
                p.copy_(0.5 + 0.2 * r)  # LayerScale around layerscale_value
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            elif name.endswith("bias"):
                p.copy_(0.1 * r)
            elif p.dim() >= 2 and name.endswith("weight"):  # Linear / Conv2d: fan-in scaled
                p.copy_(r / p[0].numel() ** 0.5)
            else:  # cls / mask / register tokens, position embeddings
                p.copy_(0.5 * r)


def case(name, model, refit_config, checkpoint_keys):
    out = here / name
    out.mkdir(parents=True, exist_ok=True)
    randomise(model)
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        shutil.copy(pathlib.Path(tmp) / "model.safetensors", out / "model.safetensors")
        shutil.copy(pathlib.Path(tmp) / "config.json", out / "config.json")
        # The file round-trips through from_pretrained (its renaming) to the same model.
        again = type(model).from_pretrained(tmp).eval()
        for k, v in model.state_dict().items():
            assert torch.equal(v, again.state_dict()[k]), k
    keys = set(load_file(str(out / "model.safetensors")).keys())
    assert keys == checkpoint_keys, sorted(keys ^ checkpoint_keys)
    (out / "refit_config.json").write_text(json.dumps(refit_config, indent=2) + "\n")

    registers = refit_config.get("num_register_tokens", 0)
    bf16_model = copy.deepcopy(model).to(torch.bfloat16)
    g = torch.Generator().manual_seed(99)
    tensors = {}
    for h, w in SIZES:
        x = torch.randn(2, 3, h, w, generator=g)
        tensors[f"x_{h}x{w}"] = x
        for prec in ("fp32", "bf16", "bf16w", "bf16w_autocast"):
            m = bf16_model if prec.startswith("bf16w") else model
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=prec.endswith("bf16") or prec.endswith("autocast")):
                o = m(pixel_values=x)
            seq = o.last_hidden_state  # in the model's precision, as Dinov2ForImageClassification uses it
            tensors[f"tokens_{prec}_{h}x{w}"] = seq.float()
            tensors[f"cls_{prec}_{h}x{w}"] = o.pooler_output.float()
            tensors[f"cls_mean_{prec}_{h}x{w}"] = torch.cat([seq[:, 0], seq[:, 1 + registers:].mean(dim=1)], dim=1).float()
    # The model in float64 at the trained size (no interpolation: transformers interpolates the
    # position embeddings in float32 whatever the model's dtype): an exact value of its own, for
    # the check that refit's float64 model computes the same function (an architecture
    # difference, a LayerNorm epsilon, moves it far more than float64's rounding).
    f64_model = copy.deepcopy(model).double()
    h, w = SIZES[0]
    with torch.no_grad():
        o = f64_model(pixel_values=tensors[f"x_{h}x{w}"].double())
    seq = o.last_hidden_state
    tensors[f"tokens_fp64_{h}x{w}"] = seq
    tensors[f"cls_fp64_{h}x{w}"] = o.pooler_output
    tensors[f"cls_mean_fp64_{h}x{w}"] = torch.cat([seq[:, 0], seq[:, 1 + registers:].mean(dim=1)], dim=1)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out / "expected.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    size = sum(f.stat().st_size for f in out.iterdir())
    print(name, "ok,", size, "bytes")


def checkpoint_keys(layers, qkv_bias, registers):
    keys = {"embeddings.cls_token", "embeddings.mask_token", "embeddings.position_embeddings",
            "embeddings.patch_embeddings.projection.weight", "embeddings.patch_embeddings.projection.bias",
            "layernorm.weight", "layernorm.bias"}
    if registers:
        keys.add("embeddings.register_tokens")
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for m in ("norm1", "norm2", "attention.output.dense", "mlp.fc1", "mlp.fc2"):
            keys |= {p + m + ".weight", p + m + ".bias"}
        for m in ("query", "key", "value"):
            keys.add(p + "attention.attention." + m + ".weight")
            if qkv_bias:
                keys.add(p + "attention.attention." + m + ".bias")
        keys |= {p + "layer_scale1.lambda1", p + "layer_scale2.lambda1"}
    return keys


torch.manual_seed(0)
common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, patch_size=4, image_size=16,
              num_channels=3, layerscale_value=0.5)

plain = Dinov2Config(**common, mlp_ratio=4, layer_norm_eps=1e-6, qkv_bias=True)
case("plain", Dinov2Model(plain),
     {**common, "mlp_ratio": 4, "layer_norm_eps": 1e-6, "qkv_bias": True, "output": "tokens"},
     checkpoint_keys(2, True, 0))

registers = Dinov2WithRegistersConfig(**common, mlp_ratio=2, layer_norm_eps=1e-5, qkv_bias=False,
                                      num_register_tokens=2)
case("registers", Dinov2WithRegistersModel(registers),
     {**common, "mlp_ratio": 2, "layer_norm_eps": 1e-5, "qkv_bias": False, "num_register_tokens": 2,
      "output": "tokens"},
     checkpoint_keys(2, False, 2))
