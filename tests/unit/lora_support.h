#pragma once
// What the LoRA, DoRA and several-adapter tests share: the small adaptable models their golden
// data was generated for (tests/golden/make_lora_peft.py, make_dora_peft.py,
// make_lora_combine.py) and the "lora" factory from the real plugin.
#include <memory>

#include "core/plugin_loader.h"
#include "refit/layers.h"
#include "refit/model.h"
#include "test_support.h"

namespace refit::lora_test {

/// One adaptable Linear 8 -> 6 named "proj".
class LinearNet : public TensorModel {
 public:
  LinearNet() { proj = register_module("proj", std::make_shared<nn::Linear>(8, 6)); }
  torch::Tensor forward(const torch::Tensor& x) override { return proj->forward(x); }
  std::shared_ptr<nn::Linear> proj;
};

/// One adaptable Conv2d 3 -> 4, kernel 3, padding 1, named "conv".
class ConvNet : public TensorModel {
 public:
  ConvNet() {
    nn::Conv2dOptions o;
    o.in_channels = 3, o.out_channels = 4, o.kernel_size = {3, 3}, o.padding = {1, 1};
    conv = register_module("conv", std::make_shared<nn::Conv2d>(o));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return conv->forward(x); }
  std::shared_ptr<nn::Conv2d> conv;
};

/// The "lora" factory from the real plugin.
struct Lora {
  Registry registry;
  PluginLoader loader{registry};
  Lora() { loader.load("lora"); }
  AdapterPtr make(Json config) {
    auto issues = std::make_shared<ConfigIssues>();
    auto build = registry.adapters.parse("lora", "/type", ConfigReader(std::move(config), "/config", issues));
    if (!issues->empty()) FAIL(ConfigError(issues->list()).what());
    return build(BuildContext{});
  }
};

/// The largest absolute difference, computed in float32 or wider (either side may be bf16).
inline double max_abs(const torch::Tensor& a, const torch::Tensor& b) {
  const auto type = at::promote_types(at::promote_types(a.scalar_type(), b.scalar_type()), torch::kFloat);
  return (a.to(type) - b.to(type)).abs().max().item<double>();
}

}  // namespace refit::lora_test
