#include "text/declared_max_length.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "text/read_file.h"

namespace refit::text {

namespace {

/// The settings file's object; nullopt when absent.
std::optional<nlohmann::json> read_settings_object(const std::filesystem::path& file) {
  auto j = read_json_if_present(file);
  if (j && !j->is_object()) throw std::runtime_error(file.string() + ": not a JSON object");
  return j;
}

std::int64_t length_in(const nlohmann::json& v, const std::filesystem::path& file, const char* key) {
  constexpr double kMax = 1 << 20;
  if (!v.is_number() || v.get<double>() < 3 || v.get<double>() > kMax ||
      v.get<double>() != static_cast<double>(static_cast<std::int64_t>(v.get<double>())))
    throw std::runtime_error(file.string() + ": \"" + key + "\" must be an integer in [3, 1048576], got " + v.dump());
  return static_cast<std::int64_t>(v.get<double>());
}

}  // namespace

std::optional<DeclaredMaxLength> declared_max_length(const std::filesystem::path& dir) {
  const auto sentence = dir / "sentence_bert_config.json";
  if (const auto j = read_settings_object(sentence); j && j->contains("max_seq_length") && !(*j)["max_seq_length"].is_null())
    return DeclaredMaxLength{length_in((*j)["max_seq_length"], sentence, "max_seq_length"),
                             "sentence_bert_config.json max_seq_length"};
  const auto tokenizer = dir / "tokenizer_config.json";
  if (const auto j = read_settings_object(tokenizer); j && j->contains("model_max_length")) {
    const auto& v = (*j)["model_max_length"];
    if (v.is_number() && v.get<double>() > (1 << 20)) return std::nullopt;  // 1e30: no limit declared
    return DeclaredMaxLength{length_in(v, tokenizer, "model_max_length"), "tokenizer_config.json model_max_length"};
  }
  return std::nullopt;
}

}  // namespace refit::text
