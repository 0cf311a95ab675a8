#pragma once
// `refit export RECIPE --out DIR [--checkpoint DIR] [--format F] [--dtype D]`: trained weights in
// files other tools read.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "run/assembly.h"

namespace refit::cli {

/// Restores the trainable weights of `checkpoint` (default: the run's latest; "none": the
/// recipe's own weights, e.g. adapters it loads from PEFT folders) and writes either
/// every adapter in the interchange format `format` that adapter declares (Adapter::format():
/// "peft" for lora), or, with "merged", every model with its adapters merged
/// (<out>/<model>.safetensors, without the buffers the model declares non-persistent; a model
/// with a reference_config() gets a folder instead, <out>/<model>/{model.safetensors,
/// config.json}, which transformers' from_pretrained loads). Merged weights are written in their registered dtypes, or, with
/// `merged_dtype`, merged in float32 and written in that dtype (float32 keeps the whole delta of
/// a bf16 base). Returns the files written.
std::vector<std::filesystem::path> export_models(const Assembly& assembly,
                                                 const std::optional<std::filesystem::path>& checkpoint,
                                                 const std::string& format, const std::filesystem::path& out,
                                                 std::optional<c10::ScalarType> merged_dtype = std::nullopt);

}  // namespace refit::cli
