#pragma once
// Loading a model's weights with strict key matching: any missing key, unexpected key or shape
// mismatch is an error that lists them (a readable diff), never a silent partial load. Sources:
// a safetensors file; transformers' sharded checkpoint (model.safetensors.index.json and its
// shards); a folder holding model.safetensors or that index; a llama-family GGUF file (names
// mapped to transformers', q/k rows un-permuted, dequantized: model/gguf_names.h). Tensors are
// read one at a time into the model's parameters in their dtypes: the whole model is never held
// a second time, nor in float32.
#include <filesystem>
#include <string>

#include "refit/model.h"

namespace refit {

/// Copies every parameter and buffer of `model` from `file` (values cast to the model's dtypes).
/// A buffer named by non_persistent_buffers() is loaded when the file has it and kept otherwise.
void load_weights(Model& model, const std::filesystem::path& file, const std::string& model_name);

/// Every parameter and buffer by path (what a weights file must contain).
std::map<std::string, torch::Tensor> model_state(const Model& model);

}  // namespace refit
