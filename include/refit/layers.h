#pragma once
// Adaptable layers: Linear and Conv2d whose forward adds the deltas of attached layer adapters
// (LoRA factors and the like). Models that want to be adaptable build with these instead of
// torch::nn::Linear / Conv2d. Parameter names are torch's ("weight", "bias"), so a model's
// paths — and its weights files — are the reference architecture's; an adapter registers its
// own submodule (e.g. "lora_default") beside them.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/autocast_mode.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/types.h>

namespace refit::nn {

/// Something added to an adaptable layer's output.
class LayerAdapter : public torch::nn::Module {
 public:
  /// The term added to the base layer's output for `input` (the layer's own input).
  virtual torch::Tensor delta(const torch::Tensor& input) = 0;
  bool active = true;   // enable/disable without detaching
  bool merged = false;  // folded into the base weight: forward must not add it again
};

/// Shared by the adaptable layers: the adapter slots and the forward rule.
class AdaptableLayer : public torch::nn::Module {
 public:
  torch::Tensor weight, bias;

  /// Attaches `adapter` under `key` (its parameters become "<layer path>.<key>.<name>").
  void add_adapter(const std::string& key, std::shared_ptr<LayerAdapter> adapter) {
    register_module(key, adapter);
    adapters_.emplace_back(key, std::move(adapter));
  }
  /// Detaches the adapter under `key` (its parameters leave the model).
  void remove_adapter(const std::string& key) {
    for (auto it = adapters_.begin(); it != adapters_.end(); ++it)
      if (it->first == key) {
        unregister_module(key);
        adapters_.erase(it);
        return;
      }
  }
  std::shared_ptr<LayerAdapter> adapter(const std::string& key) const {
    for (const auto& a : adapters_)
      if (a.first == key) return a.second;
    return nullptr;
  }
  const std::vector<std::pair<std::string, std::shared_ptr<LayerAdapter>>>& adapters() const { return adapters_; }

 protected:
  /// base(x) + Σ active, unmerged deltas. Outside autocast the input is cast to the weight's
  /// dtype for the base (a frozen bf16 layer in a bf16-true run) and the deltas see the original
  /// input (adapters cast to their own dtype), as PEFT does; the sum is in the base's dtype.
  template <class Base>
  torch::Tensor apply(const torch::Tensor& input, Base&& base) {
    const bool autocast = at::autocast::is_autocast_enabled(input.device().type());
    torch::Tensor y = base(autocast || input.scalar_type() == weight.scalar_type() ? input : input.to(weight.scalar_type()));
    for (const auto& a : adapters_)
      if (a.second->active && !a.second->merged) y = y + a.second->delta(input).to(y.scalar_type());
    return y;
  }

 private:
  std::vector<std::pair<std::string, std::shared_ptr<LayerAdapter>>> adapters_;
};

/// y = x W^T + b, initialised like torch.nn.Linear.
class Linear : public AdaptableLayer {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias = true)
      : in_features(in_features), out_features(out_features) {
    weight = register_parameter("weight", torch::empty({out_features, in_features}));
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
    if (with_bias) {
      const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
      bias = register_parameter("bias", torch::empty({out_features}).uniform_(-bound, bound));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return apply(x, [this](const torch::Tensor& in) { return at::linear(in, weight, bias); });
  }
  const std::int64_t in_features, out_features;
};

struct Conv2dOptions {
  std::int64_t in_channels = 0, out_channels = 0;
  std::vector<std::int64_t> kernel_size{1, 1}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  bool bias = true;
};

/// 2-d convolution (groups = 1), initialised like torch.nn.Conv2d.
class Conv2d : public AdaptableLayer {
 public:
  explicit Conv2d(Conv2dOptions o) : options(std::move(o)) {
    weight = register_parameter(
        "weight", torch::empty({options.out_channels, options.in_channels, options.kernel_size[0], options.kernel_size[1]}));
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
    if (options.bias) {
      const double fan_in = static_cast<double>(options.in_channels * options.kernel_size[0] * options.kernel_size[1]);
      const double bound = fan_in > 0 ? 1.0 / std::sqrt(fan_in) : 0.0;
      bias = register_parameter("bias", torch::empty({options.out_channels}).uniform_(-bound, bound));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return apply(x, [this](const torch::Tensor& in) {
      return at::conv2d(in, weight, bias, options.stride, options.padding, options.dilation, 1);
    });
  }
  const Conv2dOptions options;
};

}  // namespace refit::nn
