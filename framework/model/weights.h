#pragma once
// Loading a model's weights from safetensors with strict key matching: any missing key,
// unexpected key or shape mismatch is an error that lists them (a readable diff), never a
// silent partial load.
#include <filesystem>
#include <string>

#include "refit/model.h"

namespace refit {

/// Copies every parameter and buffer of `model` from `file` (values cast to the model's dtypes).
void load_weights(Model& model, const std::filesystem::path& file, const std::string& model_name);

/// Every parameter and buffer by path (what a weights file must contain).
std::map<std::string, torch::Tensor> model_state(const Model& model);

}  // namespace refit
