#pragma once
// Adapter interchange files on disk: <dir>/adapter_model.safetensors + <dir>/adapter_config.json
// (HF PEFT's layout).
#include <filesystem>

#include "refit/adapter.h"

namespace refit::io {

AdapterFiles read_adapter_files(const std::filesystem::path& dir);
/// Writes both files atomically (each via a temporary file and rename).
void write_adapter_files(const std::filesystem::path& dir, const AdapterFiles& files);

}  // namespace refit::io
