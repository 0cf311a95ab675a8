#pragma once
// Adapter interchange files on disk: <dir>/adapter_model.safetensors + <dir>/adapter_config.json
// (HF PEFT's layout).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "refit/adapter.h"

namespace refit::io {

AdapterFiles read_adapter_files(const std::filesystem::path& dir);
/// read_adapter_files on the two files' contents in memory (the fuzz target's entry): the same
/// checks; `dir` names the files in messages.
AdapterFiles adapter_files_from_bytes(std::shared_ptr<const std::uint8_t> weights, std::size_t weights_size,
                                      const std::string& config_text, const std::filesystem::path& dir);
/// Writes both files atomically (each via a temporary file and rename).
void write_adapter_files(const std::filesystem::path& dir, const AdapterFiles& files);

}  // namespace refit::io
