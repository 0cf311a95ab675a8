#pragma once
// What the LoRA, DoRA and several-adapter tests share: the small adaptable models their golden
// data was generated for (tests/golden/make_lora_peft.py, make_dora_peft.py,
// make_lora_combine.py) and the "lora" factory from the real plugin.
#include <memory>

#include "core/plugin_loader.h"
#include "adaptable_nets.h"
#include "test_support.h"

namespace refit::lora_test {

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
