#pragma once
// The depth (numeric_bounds.h) of a BERT encoder such as all-MiniLM-L6-v2, for the golden bounds
// of test_bert and test_predict.
#include <cstdint>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace refit::test {

/// The depth n (numeric_bounds.h) of MiniLM's token states for length T, LoRA of rank r on q/v:
/// embeddings (three rows summed, LayerNorm: 2 + 2H + 4), per layer LayerNorm twice
/// (2 (2H + 4)), q/k/v with their LoRA (H + 1 + H + r + 3), scores (d_h + 1) and the mask (1),
/// softmax (T + 3), context (T), output (H + 1), GELU (3), the intermediate (H + 1) and output
/// (I + 1), two residuals (2). A first-order depth: LayerNorm, softmax and GELU are not sums of
/// products, so bounds built on it are relative to max |exact|.
inline std::int64_t minilm_states_depth(const std::filesystem::path& folder, std::int64_t T, std::int64_t r = 0) {
  std::ifstream in(folder / "config.json");
  const auto c = nlohmann::json::parse(in);
  const std::int64_t H = c.at("hidden_size"), L = c.at("num_hidden_layers"), I = c.at("intermediate_size");
  const std::int64_t dh = H / c.at("num_attention_heads").get<std::int64_t>();
  const std::int64_t lora = r > 0 ? H + r + 3 : 0;
  const std::int64_t layer =
      2 * (2 * H + 4) + (H + 1 + lora) + (dh + 1) + 1 + (T + 3) + T + (H + 1) + 3 + (H + 1) + (I + 1) + 2;
  return 2 + 2 * H + 4 + L * layer;
}

/// The depth of the normalised mean pooling on top: the masked mean (T + 1), the norm (H + 2).
inline std::int64_t minilm_features_depth(const std::filesystem::path& folder, std::int64_t T, std::int64_t r = 0) {
  std::ifstream in(folder / "config.json");
  const std::int64_t H = nlohmann::json::parse(in).at("hidden_size");
  return minilm_states_depth(folder, T, r) + (T + 1) + (H + 2);
}

}  // namespace refit::test
