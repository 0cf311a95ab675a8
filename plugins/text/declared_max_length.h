#pragma once
// The input length a model folder declares for its text encoder, so that a text input without
// "max_length" truncates where the model's own tooling does (docs/text.md, "max_length").
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace refit::text {

struct DeclaredMaxLength {
  std::int64_t tokens = 0;
  std::string source;  // "sentence_bert_config.json max_seq_length", ...
};

/// sentence-transformers' `sentence_bert_config.json` "max_seq_length" (what SentenceTransformer
/// truncates at: 256 for all-MiniLM-L6-v2), else `tokenizer_config.json`'s "model_max_length"
/// when it is a real limit (transformers writes 1e30 for none); nullopt when neither says. A file
/// that is not JSON, or a length that is not an integer in [3, 2^20], throws naming the file.
std::optional<DeclaredMaxLength> declared_max_length(const std::filesystem::path& dir);

}  // namespace refit::text
