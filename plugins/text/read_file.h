#pragma once
// A whole text file in memory (tokenizer files, corpora, configs). No LibTorch.
#include <string>

namespace refit::text {

/// The bytes of `path`; refit::Error "<what>: cannot open <path>" when it cannot be read.
std::string read_whole_file(const std::string& path, const std::string& what = "text");

}  // namespace refit::text
