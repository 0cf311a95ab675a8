#pragma once
// Adaptable layers: Linear and Conv2d whose forward runs the base product once and hands it to
// the attached layer adapters: additive ones (LoRA) add a delta of the input, others rescale or
// gate the base output ((IA)^3) or use the layer's weight (DoRA). Models that want to be
// adaptable build with these instead of torch::nn::Linear / Conv2d. A frozen Linear's weight may
// be held quantized (refit/quantized.h): adapters then read it through dense_weight(). Parameter names are torch's
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

#include "refit/quantized.h"

namespace refit::nn {

class AdaptableLayer;

/// How a layer's parameters start: initialised like torch's layers, or left for a weights file
/// to fill (BuildContext::weights_follow).
enum class Init { random, none };

/// A tensor of `shape` that holds one element (every stride 0): the parameter a module built for
/// a weights file registers, so that building a billion-parameter model costs no memory. The
/// loader replaces it (set_data) by the loaded tensor in its final dtype or storage. Writing into
/// it is refused (its elements overlap); nothing should read it before the load.
inline torch::Tensor unloaded(c10::IntArrayRef shape, c10::ScalarType dtype = c10::kFloat) {
  return at::empty_strided(shape, std::vector<std::int64_t>(shape.size(), 0), torch::TensorOptions().dtype(dtype));
}
/// Is `t` such a placeholder (more than one element over one element of memory)?
inline bool is_unloaded(const torch::Tensor& t) {
  if (!t.defined() || t.numel() <= 1) return false;
  for (auto s : t.strides())
    if (s != 0) return false;
  return true;
}

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
  /// The dense weight (a parameter); undefined while the weight is quantized (below).
  torch::Tensor weight;
  torch::Tensor bias;

  /// "linear" or "conv2d": what adapters and layer targets ask instead of casting.
  virtual std::string kind() const = 0;

  /// The frozen weight's quantized form, or null when the weight is dense.
  const std::shared_ptr<const quant::QuantizedWeight>& quantized_weight() const { return quantized_; }
  /// Replaces the dense weight by `q` (a frozen base's declared storage; the framework calls
  /// this when it registers the model): the "weight" parameter leaves the module and the packed
  /// tensors become the buffers of a submodule "weight_<format>" ("q_proj.weight_nf4.packed"), so
  /// that they move with the model.
  void set_quantized_weight(std::shared_ptr<const quant::QuantizedWeight> q) {
    if (kind() != "linear") throw std::runtime_error("a quantized weight is supported in a Linear layer only");
    if (quantized_) unregister_module("weight_" + quantized_->format());
    if (parameters_.contains("weight")) parameters_.erase("weight");
    auto holder = std::make_shared<torch::nn::Module>();
    for (const auto& [name, t] : q->tensors()) holder->register_buffer(name, t);
    register_module("weight_" + q->format(), holder);
    weight = torch::Tensor();
    quantized_ = std::move(q);
  }
  /// The weight as a dense tensor: the parameter itself, or the quantized weight dequantized in
  /// its compute dtype (a new tensor each call; DoRA's norm, merges).
  torch::Tensor dense_weight() const { return quantized_ ? quantized_->dequantize(quantized_->compute_dtype()) : weight; }
  /// The dtype of dense_weight().
  c10::ScalarType weight_dtype() const { return quantized_ ? quantized_->compute_dtype() : weight.scalar_type(); }
  /// The weight's shape, dense or quantized.
  std::vector<std::int64_t> weight_shape() const { return quantized_ ? quantized_->shape() : weight.sizes().vec(); }
  /// Makes a quantized weight dense again, dequantized in `dtype`, as a frozen parameter (what a
  /// merge writes into); a dense weight is left as it is.
  void make_dense(c10::ScalarType dtype) {
    if (!quantized_) return;
    torch::Tensor w = quantized_->dequantize(dtype);
    unregister_module("weight_" + quantized_->format());
    quantized_.reset();
    weight = register_parameter("weight", w, /*requires_grad=*/false);
  }

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
      const auto dtype = weight_dtype();
      torch::Tensor y = base(autocast || input.scalar_type() == dtype ? input : input.to(dtype));
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
      const std::string w =
          quantized_ ? c10::str(c10::IntArrayRef(quantized_->shape())) + " " + quantized_->format() : described(weight);
      throw LayerError(this, "input " + described(input) + ", weight " + w, e.what_without_backtrace());
    }
  }

 private:
  std::vector<std::pair<std::string, std::shared_ptr<LayerAdapter>>> adapters_;
  std::shared_ptr<const quant::QuantizedWeight> quantized_;
};

/// y = x W^T + b, initialised like torch.nn.Linear (or left for a weights file: Init::none).
class Linear : public AdaptableLayer {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool with_bias = true, Init init = Init::random)
      : in_features(in_features), out_features(out_features) {
    if (init == Init::none) {
      weight = register_parameter("weight", unloaded({out_features, in_features}));
      if (with_bias) bias = register_parameter("bias", unloaded({out_features}));
      return;
    }
    weight = register_parameter("weight", torch::empty({out_features, in_features}));
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
    if (with_bias) {
      const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
      bias = register_parameter("bias", torch::empty({out_features}).uniform_(-bound, bound));
    }
  }
  std::string kind() const override { return "linear"; }
  torch::Tensor forward(const torch::Tensor& x) {
    return apply(x, [this](const torch::Tensor& in) {
      return quantized_weight() ? quantized_weight()->linear(in, bias) : at::linear(in, weight, bias);
    });
  }
  const std::int64_t in_features, out_features;
};

struct Conv2dOptions {
  std::int64_t in_channels = 0, out_channels = 0;
  std::vector<std::int64_t> kernel_size{1, 1}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  bool bias = true;
  Init init = Init::random;
};

/// 2-d convolution (groups = 1), initialised like torch.nn.Conv2d (or left for a weights file).
class Conv2d : public AdaptableLayer {
 public:
  explicit Conv2d(Conv2dOptions o) : options(std::move(o)) {
    if (options.init == Init::none) {
      weight = register_parameter("weight", unloaded({options.out_channels, options.in_channels, options.kernel_size[0],
                                                      options.kernel_size[1]}));
      if (options.bias) bias = register_parameter("bias", unloaded({options.out_channels}));
      return;
    }
    weight = register_parameter("weight", torch::empty({options.out_channels, options.in_channels, options.kernel_size[0],
                                                        options.kernel_size[1]}));
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
    if (options.bias) {
      const double fan_in = static_cast<double>(options.in_channels * options.kernel_size[0] * options.kernel_size[1]);
      const double bound = fan_in > 0 ? 1.0 / std::sqrt(fan_in) : 0.0;
      bias = register_parameter("bias", torch::empty({options.out_channels}).uniform_(-bound, bound));
    }
  }
  std::string kind() const override { return "conv2d"; }
  torch::Tensor forward(const torch::Tensor& x) {
    return apply(x, [this](const torch::Tensor& in) {
      return at::conv2d(in, weight, bias, options.stride, options.padding, options.dilation, 1);
    });
  }
  const Conv2dOptions options;
};

}  // namespace refit::nn
