"""Writes tests/golden/safetensors/mixed.safetensors with the Python `safetensors` package.

Every tensor is arange(numel) reshaped and cast, so the C++ test can recompute the values.
Run: ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_safetensors.py  (pip install safetensors)
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"torch": "2.11.0", "safetensors": "0.8.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import pathlib

import torch
from safetensors.torch import save_file

out = pathlib.Path(__file__).parent / "safetensors" / "mixed.safetensors"
tensors = {
    "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
    "f16": torch.arange(5, dtype=torch.float32).to(torch.float16) / 8,
    "bf16": (torch.arange(4, dtype=torch.float32) - 1.5).to(torch.bfloat16).reshape(2, 2),
    "f64": torch.arange(3, dtype=torch.float64) * 0.1,
    "i64": torch.arange(4, dtype=torch.int64) - 2,
    "i32": torch.arange(3, dtype=torch.int32) * 7,
    "u8": torch.arange(7, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "scalar": torch.tensor(3.25),
    "empty": torch.zeros(0, 4),
}
save_file(tensors, str(out), metadata={"format": "pt", "producer": "python safetensors"})
print(out, out.stat().st_size, "bytes")
