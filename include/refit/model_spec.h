#pragma once
// What a model declares about itself *before* it is registered: its role (trainable or frozen),
// its dtype, its device and its optimizer overrides. Registration makes the declaration true in
// place, or refuses it (see framework/model/model_registry.h and docs/precision.md).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

namespace refit {

/// Per-group optimizer settings; unset fields fall back to the recipe's optimizer section.
struct OptimizerOverrides {
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<std::pair<double, double>> betas;
  std::optional<double> eps;
  bool any() const { return lr || weight_decay || betas || eps; }
};

/// A declaration for the parameters of a model whose path (relative to the model, e.g.
/// "encoder.layer.0.attention.q.lora_A.default.weight") fully matches `pattern` (ECMAScript
/// regex). Adapters add one for what they inject, so that "frozen bf16 backbone + trainable fp32
/// adapter" is one model with two kinds of parameters, both honoured.
struct ParameterRule {
  std::string pattern;
  bool trainable = true;
  c10::ScalarType dtype = c10::kFloat;
  std::string group;             // optimizer parameter group name ("" = the model's group)
  OptimizerOverrides optimizer;  // used when `group` is set
};

/// How a frozen model stores the weights of its adaptable Linear layers (docs/quantization.md):
/// dense in `dtype` (format ""), or quantized — "nf4" (bitsandbytes' NF4, blocks of `blocksize`,
/// the block maxima double-quantized by default, as QLoRA) or "int8" (row-wise) — with the
/// products computed in `dtype`. A quantized weight cannot train: a trainable model with a
/// storage is refused at registration.
struct WeightStorage {
  std::string format;
  std::int64_t blocksize = 64;
  bool double_quantization = true;
  bool quantized() const { return !format.empty(); }
};

struct ModelSpec {
  std::string name;
  bool trainable = false;
  c10::ScalarType dtype = c10::kFloat;
  WeightStorage storage;
  std::string device = "auto";  // cpu, cuda, cuda:N, auto
  OptimizerOverrides optimizer;
  std::vector<ParameterRule> rules;  // later rules win over earlier ones and over the model's role
};

}  // namespace refit
