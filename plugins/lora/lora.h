#pragma once
// LoRA (Hu et al. 2021) for adaptable Linear and Conv2d layers, numerically and file-compatible
// with HF PEFT: delta(x) = B(A(dropout(x))) * scaling, scaling = alpha / r (rsLoRA: alpha / sqrt(r)),
// A initialised Kaiming-uniform (a = sqrt(5)) or Gaussian N(0, 1/r), B zeros.
// DoRA (use_dora, Liu et al. 2024, as PEFT 0.21.2): y = base(x) + (m / ||W + s B A|| - 1) (base(x) - b)
// + m / ||W + s B A|| * s B A x, the norm per output channel and detached from the graph, the
// magnitude m initialised to the base weight's norms.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "refit/adapter.h"
#include "refit/config.h"
#include "refit/layers.h"

namespace refit::lora {

/// A new adapter made of earlier ones, as PEFT's add_weighted_adapter ("linear": same ranks,
/// A and B weighted by ±sqrt(|w s|); "cat": ranks summed, A weighted by w s; "svd": the weighted sum
/// of the deltas truncated to svd_rank by SVD). Its alpha is its rank (scaling 1), as PEFT's.
struct LoraCombination {
  std::vector<std::string> adapters;
  std::vector<double> weights;
  std::string type = "linear";
  std::int64_t svd_rank = 0;  // 0: the largest source rank
};

struct LoraOptions {
  std::string name = "default";  // several named adapters can sit on one model
  std::int64_t r = 8;
  double alpha = 8;
  bool use_rslora = false;
  double dropout = 0.0;
  std::string target_regex;                 // full match on the module path
  std::vector<std::string> target_modules;  // PEFT-style: a path or a path suffix after '.'
  std::vector<std::string> layer_types{"linear", "conv2d"};
  std::string init = "kaiming";            // kaiming (PEFT's default) or gaussian
  bool fused = true;                       // Linear delta as one autograd node (fused_delta.h); false: op by op
  bool use_dora = false;                   // weight-decomposed LoRA (a magnitude per output channel)
  bool trainable = true;                   // false: the factors are frozen (float32) parameters
  bool active = true;                      // false: attached (loaded, exported, mergeable once activated) but not applied
  double weight = 1;                       // multiplies the scaling (PEFT's set_scale); not written to files
  std::optional<LoraCombination> combine;  // built from earlier adapters instead of targets

  double scaling() const;  // alpha / r (or / sqrt(r)) times weight
  std::string key() const { return "lora_" + name; }
  static LoraOptions from_config(const ConfigReader& c);
};

/// The factors attached to one layer.
class LoraDelta : public nn::LayerAdapter {
 public:
  LoraDelta(const nn::AdaptableLayer& layer, const LoraOptions& options);
  torch::Tensor delta(const torch::Tensor& input) override;
  /// DoRA: rescales the output so far (see the top of this file); plain LoRA: adds delta().
  torch::Tensor adapt(const torch::Tensor& input, const torch::Tensor& output, const nn::AdaptableLayer& layer) override;
  /// scaling * B A (Linear) or its convolutional equivalent, in float32, shaped like the weight.
  torch::Tensor delta_weight() const;
  /// `weight` (float32) with this adapter folded in / taken out again. DoRA's merge needs the
  /// weight without any merged adapter (`unmerged_base`) for its norm, as PEFT's; unmerge reuses it.
  torch::Tensor merged_weight(const torch::Tensor& weight, const torch::Tensor& unmerged_base);
  torch::Tensor unmerged_weight(const torch::Tensor& weight) const;
  bool dora() const { return dora_; }
  bool rslora() const { return rslora_; }
  double scaling() const { return scaling_; }

  torch::Tensor lora_A, lora_B;
  torch::Tensor lora_magnitude_vector;  // DoRA only: [out] (Linear) or [1, out, 1, 1] (Conv2d), as PEFT's
  std::uint64_t merge_order = 0;        // when it was merged (several merged adapters are undone last first)

 private:
  /// DoRA's ||W + scaling * lora_weight|| per output channel, shaped like the magnitude.
  torch::Tensor weight_norm(const torch::Tensor& weight, const torch::Tensor& lora_weight, double scaling) const;
  bool conv_ = false;
  std::vector<std::int64_t> stride_, padding_, dilation_;
  double scaling_ = 1, dropout_ = 0;
  bool fused_ = true, dora_ = false, rslora_ = false;
  torch::Tensor merged_norm_;  // DoRA: the norm its merge divided by (PEFT caches it the same way)
};

class LoraAdapter : public Adapter {
 public:
  explicit LoraAdapter(LoraOptions options) : options_(std::move(options)) {}
  void attach(Model& model) override;
  std::vector<ParameterRule> parameter_rules() const override;
  void set_active(Model& model, bool active) override;
  void merge(Model& model) override;
  void unmerge(Model& model) override;
  void eject(Model& model) override;
  /// The adapter's "name" when it is not PEFT's "default" (which needs no telling apart).
  std::string name() const override { return options_.name == "default" ? "" : options_.name; }
  /// B starts at zero, so a fresh LoRA adds exactly nothing; not DoRA (its magnitude rescales by
  /// a rounded norm) nor a combination of earlier adapters.
  bool identity_when_fresh() const override { return !options_.use_dora && !options_.combine; }
  std::string format() const override { return "peft"; }
  AdapterFiles export_files(const Model& model) const override;
  void import_files(Model& model, const AdapterFiles& files) override;
  const LoraOptions& options() const { return options_; }

 private:
  /// (module path, layer, its delta) for every layer this adapter is attached to.
  std::vector<std::tuple<std::string, nn::AdaptableLayer*, std::shared_ptr<LoraDelta>>> attached(const Model& model) const;
  void attach_combination(Model& model);
  LoraOptions options_;
};

}  // namespace refit::lora
