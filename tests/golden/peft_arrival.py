"""The check both PEFT generators make (make_bert_peft.py, make_smollm2_peft.py): every tensor of
an adapter file refit wrote arrived in the PEFT model loaded from it, with its values, and the
model has no LoRA tensor the file lacks."""
import torch
from safetensors.torch import load_file


def assert_all_arrived(model, adapter_file, what):
    """Returns the file's tensors (by their PEFT file names) once every one is found in `model`."""
    file_tensors = load_file(str(adapter_file))
    state = model.state_dict()
    for key, value in file_tensors.items():
        loaded = key.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        assert loaded in state, f"{key} did not arrive in the PEFT model"
        assert torch.equal(state[loaded], value), f"{key} arrived with other values"
    lora_params = [k for k in state if ".lora_" in k]
    assert len(lora_params) == len(file_tensors), (len(lora_params), len(file_tensors))
    print(f"all {len(file_tensors)} tensors of refit's adapter arrived in PEFT's {what}")
    return file_tensors
