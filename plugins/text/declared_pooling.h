#pragma once
// The pooling and normalisation a sentence-transformers model folder declares for its sentence
// embedding, so that a bert model without "output" / "normalize" in the recipe computes the
// embedding the model's own tooling computes (docs/models.md, "bert").
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace refit::text {

struct DeclaredPooling {
  std::optional<std::string> output;  // "mean", "cls" or "max"
  std::string output_source;          // "1_Pooling/config.json pooling_mode_mean_tokens"
  std::optional<bool> normalize;
  std::string normalize_source;  // "modules.json Normalize", "modules.json, no Normalize"
};

/// What sentence-transformers' `modules.json` in `dir` declares. Its modules must be a
/// Transformer, a Pooling and optionally a Normalize (matched by class name, the type's last
/// component): normalisation is whether a Normalize module is listed; the pooling is the one
/// true `pooling_mode_*` of the Pooling module's `config.json` (in the module's "path",
/// `1_Pooling` as sentence-transformers writes it): `pooling_mode_mean_tokens` "mean",
/// `pooling_mode_cls_token` "cls", `pooling_mode_max_tokens` "max"; its
/// `word_embedding_dimension`, when given, must be `hidden_size`. The pooling is read only with
/// `need_output` (a recipe that sets "output" is not refused for a mode refit does not compute).
/// Nothing is declared without modules.json (sentence-transformers then mean-pools, unnormalised:
/// the bert model's defaults). Throws std::runtime_error naming the file and the key: a file that
/// is not JSON or not of that shape, a value of the wrong type, a module other than those three,
/// no Pooling module, no true mode, several (sentence-transformers concatenates them), or
/// `pooling_mode_mean_sqrt_len_tokens`, `_weightedmean_tokens`, `_lasttoken` (not computed).
DeclaredPooling declared_pooling(const std::filesystem::path& dir, std::int64_t hidden_size, bool need_output);

}  // namespace refit::text
