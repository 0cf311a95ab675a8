#pragma once
// A whole text file in memory (tokenizer files, corpora, configs). No LibTorch.
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace refit::text {

/// The bytes of `path`; refit::Error "<what>: cannot open <path>" when it cannot be read.
std::string read_whole_file(const std::string& path, const std::string& what = "text");

/// The JSON document in `file` (a model folder's optional settings), or nullopt when the file
/// cannot be opened; std::runtime_error "<file>: not JSON" when it does not parse.
std::optional<nlohmann::json> read_json_if_present(const std::filesystem::path& file);

}  // namespace refit::text
