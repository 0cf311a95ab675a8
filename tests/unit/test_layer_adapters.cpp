// Layer adapters beyond additive deltas (SDK 4): an adapter sees the base output and the layer,
// so a multiplicative one ((IA)^3, the out-of-tree example plugin "ia3") costs one base product;
// layer targeting is shared by every adapter (refit/layer_targets.h).
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "core/plugin_loader.h"
#include "model/model_registry.h"
#include "refit/autocast.h"
#include "refit/layer_targets.h"
#include "data_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_layer_adapters {

using namespace refit;
using namespace refit::test;

namespace {

/// Two adaptable Linear layers: "q" then "out".
class TwoLinear : public TensorModel {
 public:
  TwoLinear() {
    q = register_module("q", std::make_shared<nn::Linear>(6, 5));
    out = register_module("out", std::make_shared<nn::Linear>(5, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return out->forward(at::relu(q->forward(x))); }
  std::shared_ptr<nn::Linear> q, out;
};

AdapterPtr build_adapter(Registry& registry, const std::string& type, Json config) {
  auto issues = std::make_shared<ConfigIssues>();
  auto builder = registry.adapters.parse(type, "/type", ConfigReader(std::move(config), "/config", issues));
  if (!issues->empty()) FAIL(ConfigError(issues->list()).what());
  return builder(BuildContext{});
}

/// How many times each ATen op named in `names` ran inside `f` (RecordFunction, on this thread).
template <class F>
std::map<std::string, int> count_ops(F&& f, const std::vector<std::string>& names) {
  static thread_local std::map<std::string, int>* counts = nullptr;
  std::map<std::string, int> out;
  for (const auto& n : names) out[n] = 0;
  counts = &out;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        auto it = counts->find(fn.name());
        if (it != counts->end()) ++it->second;
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  f();
  at::removeCallback(handle);
  counts = nullptr;
  return out;
}

}  // namespace

TEST_CASE("(IA)^3: one learned scale per output channel, one base product per forward, trainable fp32 on bf16") {
  Registry registry;
  PluginLoader loader(registry);
  loader.load("ia3", {test_plugin_dir()});
  torch::manual_seed(5);
  auto model = std::make_shared<TwoLinear>();
  const torch::Tensor x = torch::randn({4, 6});
  const torch::Tensor before = model->forward(x).detach();

  AdapterPtr ia3 = build_adapter(registry, "ia3", Json{{"target_modules", {"q"}}});
  ia3->attach(*model);
  // Starts at 1: the model is unchanged.
  CHECK(torch::equal(model->forward(x), before));
  const auto scale = model->q->adapter("ia3_default");
  REQUIRE(scale);
  CHECK_FALSE(model->out->adapter("ia3_default"));
  torch::Tensor l = scale->named_parameters()["ia3_l"];
  CHECK(l.sizes() == torch::IntArrayRef({5}));

  // y = out(relu(q(x) * l)).
  {
    torch::NoGradGuard no_grad;
    l.copy_(torch::linspace(0.5, 1.5, 5));
  }
  const torch::Tensor expected =
      at::linear(at::relu(at::linear(x, model->q->weight, model->q->bias) * l), model->out->weight, model->out->bias);
  CHECK((model->forward(x) - expected).abs().max().item<double>() < 1e-6);

  // One base product per layer: two aten::linear per forward, as without the adapter.
  const auto counts = count_ops([&] { model->forward(x); }, {"aten::linear"});
  CHECK(counts.at("aten::linear") == 2);

  // Registered frozen bf16 with the adapter's rule: the scale trains in fp32, the base is bf16.
  ModelSpec spec;
  spec.name = "m";
  spec.trainable = false;
  spec.dtype = c10::kBFloat16;
  spec.rules = ia3->parameter_rules();
  ModelRegistry models(Precision::bf16_mixed);
  models.add(model, spec, torch::kCPU, std::vector<std::string>(spec.rules.size(), "ia3"));
  CHECK(model->q->weight.scalar_type() == c10::kBFloat16);
  CHECK_FALSE(model->q->weight.requires_grad());
  CHECK(l.scalar_type() == c10::kFloat);
  CHECK(l.requires_grad());
  {
    AutocastGuard autocast(c10::DeviceType::CPU, c10::kBFloat16, true);
    model->forward(x).to(torch::kFloat).pow(2).sum().backward();
  }
  REQUIRE(l.grad().defined());
  CHECK(l.grad().scalar_type() == c10::kFloat);
  CHECK(l.grad().abs().sum().item<double>() > 0);

  // Disabled: the base model again.
  ia3->set_active(*model, false);
  CHECK((model->forward(x) - before).abs().max().item<double>() < 5e-2);  // bf16 base now
}

TEST_CASE("layer targets: PEFT-style suffixes, a full-path regex, and an error listing the adaptable layers") {
  TwoLinear model;
  LayerTargets t;
  t.target_modules = {"out"};
  auto picked = target_layers(model, t, "test");
  REQUIRE(picked.size() == 1);
  CHECK(picked[0].first == "out");
  LayerTargets r;
  r.target_regex = "q|out";
  CHECK(target_layers(model, r, "test").size() == 2);
  // RE2: deep nesting parses without recursion; an invalid pattern is an error saying why.
  r.target_regex = std::string(100000, '(') + "q" + std::string(100000, ')');
  CHECK(target_layers(model, r, "test").size() == 1);
  r.target_regex = "q|(out";
  CHECK_THROWS_WITH(target_layers(model, r, "test"), Catch::Contains("is not a valid regex: missing )"));
  LayerTargets none;
  none.target_modules = {"k"};
  CHECK_THROWS_WITH(target_layers(model, none, "ia3 \"default\""),
                    Catch::Contains("ia3 \"default\": no layer matched the targets; adaptable layers: q, out"));
  LayerTargets conv_only = t;
  conv_only.layer_types = {"conv2d"};
  CHECK_THROWS(target_layers(model, conv_only, "test"));
}

}  // namespace refit_test_layer_adapters
