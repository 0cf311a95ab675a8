#pragma once
// Adaptable layers: Linear and Conv2d whose forward runs the base product once and hands it to
// the attached layer adapters: additive ones (LoRA) add a delta of the input, others rescale or
// gate the base output ((IA)^3) or use the layer's weight (DoRA). Models that want to be
// adaptable build with these instead of torch::nn::Linear / Conv2d. Parameter names are torch's
// ("weight", "bias"), so a model's paths — and its weights files — are the reference
// architecture's; an adapter registers its own submodule (e.g. "lora_default") beside them.
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/autocast_mode.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/types.h>

namespace refit::nn {

class AdaptableLayer;

/// A LibTorch error raised inside an adaptable layer's forward (an input that does not fit the
/// weight), carrying the layer, so that run_chain (refit/model.h) can name its path in the model
/// ("encoder.layer.3.intermediate.dense"), with what it was given.
class LayerError : public std::runtime_error {
 public:
  LayerError(const torch::nn::Module* layer, std::string given, const std::string& message)
      : std::runtime_error(message), layer(layer), given(std::move(given)) {}
  const torch::nn::Module* layer;
  std::string given;  // "input [2, 5] Float, weight [3, 4] Float"
};

/// Something that changes an adaptable layer's output. Implement delta() for an additive
/// adapter (output = base + delta(input)), or adapt() for any other: it receives the layer's
/// input, the output so far (the base product, computed once, then each earlier adapter's
/// result) and the layer itself (its weight, bias and options), and returns the new output.
class LayerAdapter : public torch::nn::Module {
 public:
  /// The term added to the base layer's output for `input` (the layer's own input).
  virtual torch::Tensor delta(const torch::Tensor& input) {
    (void)input;
    throw std::runtime_error("this layer adapter implements neither delta() nor adapt()");
  }
  /// The layer's output with this adapter applied. The default adds delta(input) in the
  /// output's dtype.
  virtual torch::Tensor adapt(const torch::Tensor& input, const torch::Tensor& output, const AdaptableLayer& layer) {
    (void)layer;
    return output + delta(input).to(output.scalar_type());
  }
  bool active = true;   // enable/disable without detaching
  bool merged = false;  // folded into the base weight: forward must not apply it again
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
  /// The base product once, then every active, unmerged adapter in attachment order
  /// (additive ones: y + delta(x)). Outside autocast the input is cast to the weight's dtype for
  /// the base (a frozen bf16 layer in a bf16-true run) and the adapters see the original input
  /// (they cast to their own dtype), as PEFT does; the result is in the base's dtype.
  /// A LibTorch error on the way is rethrown as a LayerError naming this layer.
  template <class Base>
  torch::Tensor apply(const torch::Tensor& input, Base&& base) {
    try {
      const bool autocast = at::autocast::is_autocast_enabled(input.device().type());
      torch::Tensor y =
          base(autocast || input.scalar_type() == weight.scalar_type() ? input : input.to(weight.scalar_type()));
      for (const auto& a : adapters_)
        if (a.second->active && !a.second->merged) {
          const auto dtype = y.scalar_type();
          y = a.second->adapt(input, y, *this);
          if (y.scalar_type() != dtype) y = y.to(dtype);
        }
      return y;
    } catch (const c10::Error& e) {
      auto described = [](const torch::Tensor& t) {
        return t.defined() ? c10::str(t.sizes()) + " " + std::string(c10::toString(t.scalar_type())) : std::string("(none)");
      };
      throw LayerError(this, "input " + described(input) + ", weight " + described(weight), e.what_without_backtrace());
    }
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
    weight = register_parameter("weight", torch::empty({options.out_channels, options.in_channels, options.kernel_size[0],
                                                        options.kernel_size[1]}));
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
