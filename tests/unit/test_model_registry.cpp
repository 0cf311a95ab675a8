// The model registry: declarations applied in place (dtype, requires_grad, storage), unsafe
// declarations refused, optimizer groups holding exactly the trainable parameters.
#include <torch/nn/modules/linear.h>

#include "model/model_registry.h"
#include "precision/autocast_guard.h"
#include "cli/commands/inspect.h"
#include "core/recipe_parser.h"
#include "run/assembly.h"
#include "test_support.h"
#include "train/optimizer.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_model_registry {

using namespace refit;

namespace {

/// A LoRA-style layer: frozen base weight + trainable factors, as one model.
class LoraLinear : public TensorModel {
 public:
  LoraLinear() {
    base = register_module("base", torch::nn::Linear(8, 8));
    lora_A = register_parameter("lora_A", torch::randn({2, 8}));
    lora_B = register_parameter("lora_B", torch::zeros({8, 2}));
    register_buffer("scale", torch::ones({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    return base->forward(x) + torch::matmul(torch::matmul(x, lora_A.t()), lora_B.t());
  }
  torch::nn::Linear base{nullptr};
  torch::Tensor lora_A, lora_B;
};

ModelSpec frozen_bf16_with_fp32_lora() {
  ModelSpec s;
  s.name = "backbone";
  s.trainable = false;
  s.dtype = c10::kBFloat16;
  ParameterRule r;
  r.pattern = "lora_[AB]";
  r.trainable = true;
  r.dtype = c10::kFloat;
  s.rules.push_back(r);
  return s;
}

}  // namespace

TEST_CASE("frozen bf16 + trainable fp32 LoRA: every parameter's dtype, requires_grad and storage") {
  auto model = std::make_shared<LoraLinear>();
  // Keep the Parameter objects and their old storage: registration must change the very same
  // Parameters in place (set_data), not swap in copies.
  torch::Tensor base_weight = model->base->weight, lora_a = model->lora_A;
  const void* old_base_storage = base_weight.data_ptr();
  auto base_before = base_weight.detach().clone();

  ModelRegistry registry(Precision::bf16_mixed);
  const auto& reg = registry.add(model, frozen_bf16_with_fp32_lora(), torch::kCPU);

  std::map<std::string, std::pair<c10::ScalarType, bool>> expected{{"base.weight", {c10::kBFloat16, false}},
                                                                   {"base.bias", {c10::kBFloat16, false}},
                                                                   {"lora_A", {c10::kFloat, true}},
                                                                   {"lora_B", {c10::kFloat, true}}};
  REQUIRE(reg.parameters.size() == expected.size());
  for (const auto& item : model->named_parameters()) {
    INFO(item.key());
    auto e = expected.at(item.key());
    CHECK(item.value().scalar_type() == e.first);
    CHECK(item.value().requires_grad() == e.second);
    CHECK(item.value().device().is_cpu());
  }
  // Same Parameter objects as before registration, with new (bf16) storage for the base.
  CHECK(model->base->weight.unsafeGetTensorImpl() == base_weight.unsafeGetTensorImpl());
  CHECK(base_weight.scalar_type() == c10::kBFloat16);
  CHECK(base_weight.data_ptr() != old_base_storage);
  CHECK(torch::allclose(base_weight.to(torch::kFloat), base_before, 1e-2, 1e-2));
  CHECK(lora_a.scalar_type() == c10::kFloat);
  // Buffers of a frozen model follow its dtype.
  CHECK(model->named_buffers()["scale"].scalar_type() == c10::kBFloat16);
  // The forward still runs under autocast with mixed parameter dtypes.
  AutocastGuard autocast(c10::DeviceType::CPU, c10::kBFloat16, true);
  auto y = model->forward(torch::randn({3, 8}));
  CHECK(y.sizes() == torch::IntArrayRef({3, 8}));
}

TEST_CASE("the optimizer holds exactly the trainable parameters, by identity, in fp32") {
  auto frozen = std::make_shared<LoraLinear>();
  auto head = std::make_shared<LoraLinear>();
  ModelRegistry registry(Precision::bf16_mixed);
  registry.add(frozen, frozen_bf16_with_fp32_lora(), torch::kCPU);
  ModelSpec head_spec;
  head_spec.name = "head";
  head_spec.trainable = true;
  head_spec.optimizer.lr = 0.5;
  head_spec.optimizer.weight_decay = 0.25;
  head_spec.optimizer.betas = std::make_pair(0.8, 0.95);
  head_spec.optimizer.eps = 1e-6;
  registry.add(head, head_spec, torch::kCPU);

  OptimizerSpec defaults;
  defaults.lr = 1e-3;
  auto groups = registry.parameter_groups(defaults);
  auto optimizer = make_optimizer(defaults, groups);

  std::set<const void*> expected{frozen->lora_A.unsafeGetTensorImpl(), frozen->lora_B.unsafeGetTensorImpl()};
  for (const auto& p : head->parameters()) expected.insert(p.unsafeGetTensorImpl());
  std::set<const void*> held;
  for (std::size_t g = 0; g < optimizer->group_count(); ++g)
    for (const auto& p : optimizer->group(g).parameters) {
      held.insert(p.unsafeGetTensorImpl());
      CHECK(p.scalar_type() == c10::kFloat);
      CHECK(p.requires_grad());
    }
  CHECK(held == expected);

  // Every override lands in its own group, not only the learning rate; the head's bias (1-D)
  // is in a group of its own without weight decay, with the head's other settings.
  REQUIRE(optimizer->group_count() == 3);
  const auto& g0 = optimizer->group(0);
  const auto& g1 = optimizer->group(1);
  const auto& g2 = optimizer->group(2);
  CHECK(g0.name == "backbone");
  CHECK(g0.lr == 1e-3);
  CHECK(g0.weight_decay == defaults.weight_decay);
  CHECK(g1.name == "head");
  CHECK(g1.lr == 0.5);
  CHECK(g1.weight_decay == 0.25);
  CHECK(g1.betas == std::make_pair(0.8, 0.95));
  CHECK(g1.eps == 1e-6);
  CHECK(g2.name == "head.no_decay");
  CHECK(g2.weight_decay == 0.0);
  CHECK(g2.lr == 0.5);
  CHECK(g2.betas == std::make_pair(0.8, 0.95));
  CHECK(g2.eps == 1e-6);
  REQUIRE(g2.parameters.size() == 1);
  CHECK(g2.parameters[0].is_same(head->base->bias));
}

namespace {

/// Parameters of every kind weight decay meets: a matrix, a bias, a norm scale, LayerScale, a
/// token (3-D), a 2-D parameter named like a bias.
class Kinds : public TensorModel {
 public:
  Kinds() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    norm_weight = register_parameter("norm_weight", torch::ones({4}));
    gamma = register_parameter("layer_scale", torch::ones({4}));
    token = register_parameter("cls_token", torch::zeros({1, 1, 4}));
    pair_bias = register_parameter("pair_bias", torch::zeros({2, 2}));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return fc->forward(x) * gamma * norm_weight; }
  torch::nn::Linear fc{nullptr};
  torch::Tensor norm_weight, gamma, token, pair_bias;
};

std::set<std::string> names_in(const ParameterGroup& g, const ModelRegistry& r) {
  std::set<std::string> out;
  for (const auto& t : g.parameters)
    for (const auto& m : r.models())
      for (const auto& p : m.parameters)
        if (p.tensor.is_same(t)) out.insert(p.path);
  return out;
}

}  // namespace

TEST_CASE("weight decay spares 1-D parameters and biases by default, per group overridable") {
  auto model = std::make_shared<Kinds>();
  ModelRegistry registry(Precision::fp32);
  ModelSpec spec;
  spec.name = "m";
  spec.trainable = true;
  registry.add(model, spec, torch::kCPU);
  OptimizerSpec defaults;
  defaults.weight_decay = 0.05;

  auto groups = registry.parameter_groups(defaults);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].name == "m");
  CHECK(groups[0].weight_decay == 0.05);
  CHECK(names_in(groups[0], registry) == std::set<std::string>{"fc.weight", "cls_token"});
  CHECK(groups[1].name == "m.no_decay");
  CHECK(groups[1].weight_decay == 0.0);
  CHECK(names_in(groups[1], registry) == std::set<std::string>{"fc.bias", "norm_weight", "layer_scale", "pair_bias"});

  // Turned off for the run, or for the group: one group, everything decayed.
  auto none = defaults;
  none.exempt_1d_and_bias = false;
  CHECK(registry.parameter_groups(none).size() == 1);
  CHECK(registry.parameter_groups(defaults, {{"m", false}}).size() == 1);
  // And back on for one group when the run's default is off.
  CHECK(registry.parameter_groups(none, {{"m", true}}).size() == 2);
  // A group without weight decay is not split.
  auto zero = defaults;
  zero.weight_decay = 0;
  CHECK(registry.parameter_groups(zero).size() == 1);

  CHECK(is_1d_or_bias("blocks.0.attn.qkv.bias", torch::zeros({2, 2})));
  CHECK_FALSE(is_1d_or_bias("blocks.0.attn.qkv.weight", torch::zeros({2, 2})));
  CHECK_FALSE(is_1d_or_bias("biased.weight", torch::zeros({2, 2})));
}

// ---- validation errors, each triggered by a recipe ------------------------------------------

namespace {

Json recipe(const std::string& precision, Json models) {
  return Json{{"plugins", {{"load", {"test_good", "vision"}}, {"paths", {test::test_plugin_dir()}}}},
              {"models", models},
              {"data", {{"train", {{"type", "test_constant"}}}}},
              {"objective", {{"type", "classification"}, {"config", {{"models", {models[0]["name"]}}}}}},
              {"training", {{"duration", "1:step"}, {"precision", precision}}}};
}

std::string registration_error(const Json& doc) {
  Assembly assembly(parse_recipe(doc, "/tmp"));
  try {
    assembly.build_models();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Json model(const std::string& name, bool trainable, const std::string& dtype, Json config = Json::object()) {
  return Json{{"name", name}, {"type", "test_net"}, {"config", config}, {"trainable", trainable}, {"dtype", dtype}};
}

}  // namespace

TEST_CASE("registration errors, each from a recipe") {
  SECTION("trainable fp16 under fp16 loss scaling") {
    auto m = registration_error(recipe("fp16-mixed", {model("net", true, "float16")}));
    CHECK_THAT(m, Catch::StartsWith("/models/0: model \"net\", parameter \"encoder.weight\"") &&
                      Catch::Contains("cannot unscale float16 gradients"));
  }
  SECTION("trainable low-precision weights without bf16-true") {
    auto m = registration_error(recipe("bf16-mixed", {model("net", true, "bfloat16")}));
    CHECK_THAT(m, Catch::Contains("trainable parameters declared bfloat16 but the run's precision is bf16-mixed") &&
                      Catch::Contains("bf16-true"));
    CHECK(registration_error(recipe("bf16-true", {model("net", true, "bfloat16")})).empty());
  }
  SECTION("frozen bfloat16 weights under fp16-mixed") {
    Json frozen = model("backbone", false, "bfloat16");
    Json head = model("net", true, "float32");
    auto m = registration_error(recipe("fp16-mixed", {head, frozen}));
    CHECK_THAT(m, Catch::StartsWith("/models/1: model \"backbone\", parameter \"encoder.weight\"") &&
                      Catch::Contains("frozen bfloat16 weights cannot run under fp16-mixed") &&
                      Catch::Contains("at::autocast::prioritize") && Catch::Contains("\"dtype\": \"float16\""));
    // float16 frozen weights (what the message proposes) and bfloat16 under bf16-mixed register.
    CHECK(registration_error(recipe("fp16-mixed", {head, model("backbone", false, "float16")})).empty());
    CHECK(registration_error(recipe("bf16-mixed", {head, frozen})).empty());
  }
  SECTION("no trainable parameter at all") {
    auto m = registration_error(recipe("bf16-mixed", {model("net", false, "bfloat16")}));
    CHECK_THAT(m, Catch::Contains("no trainable parameter") && Catch::Contains("(net)"));
  }
  SECTION("a device that cannot run here") {
    Json m0 = model("net", true, "float32");
    m0["device"] = "cuda:3";
    auto m = registration_error(recipe("fp32", {m0}));
    CHECK_THAT(m, Catch::Contains("device \"cuda:3\" requested"));
  }
  SECTION("the same parameter registered twice") {
    auto m = registration_error(
        recipe("fp32", {model("a", true, "float32", {{"tied", true}}), model("b", true, "float32", {{"tied", true}})}));
    CHECK_THAT(m, Catch::StartsWith("/models/1: model \"b\", parameter \"encoder.weight\"") &&
                      Catch::Contains("already registered as \"a:encoder.weight\""));
  }
  SECTION("an adapter's injected parameters carry their own spec") {
    Json m0 = model("net", false, "bfloat16");
    m0["adapters"] = {{{"type", "test_lora"}, {"config", {{"target", "encoder"}, {"r", 2}}}}};
    Assembly assembly(parse_recipe(recipe("bf16-mixed", {m0}), "/tmp"));
    auto reg = assembly.build_models();
    for (const auto& p : reg->models()[0].parameters) {
      INFO(p.path);
      bool lora = p.path.find("lora_") != std::string::npos;
      CHECK(p.trainable == lora);
      CHECK(p.tensor.scalar_type() == (lora ? c10::kFloat : c10::kBFloat16));
      CHECK(p.owner == (lora ? "test_lora" : ""));
    }
    std::string table = cli::inspect(assembly);
    CHECK_THAT(table, Catch::Contains("+ test_lora") && Catch::Contains("bfloat16"));
  }
}

TEST_CASE("a parameter rule that matches no parameter is an error naming the rule and the model's paths") {
  auto model = std::make_shared<LoraLinear>();
  ModelSpec spec = frozen_bf16_with_fp32_lora();
  ParameterRule typo;
  typo.pattern = "lora_a";  // the parameter is "lora_A"
  typo.trainable = true;
  spec.rules.push_back(typo);
  ModelRegistry registry(Precision::bf16_mixed);
  CHECK_THROWS_WITH(registry.add(model, spec, torch::kCPU),
                    Catch::Contains("parameter rule \"lora_a\" matches no parameter") && Catch::Contains("this model's: ") &&
                        Catch::Contains("base.weight") && Catch::Contains("lora_A"));
  CHECK(registry.models().empty());
  // Nothing was applied: the model's parameters are as built (float32, trainable by default).
  CHECK(model->base->weight.scalar_type() == c10::kFloat);
}

namespace {
/// A parameter with a long name, for patterns that backtrack on it.
class LongName : public TensorModel {
 public:
  LongName() { w = register_parameter(std::string(40, 'x'), torch::zeros({2})); }
  torch::Tensor forward(const torch::Tensor& x) override { return x * w.sum(); }
  torch::Tensor w;
};
}  // namespace

TEST_CASE("parameter rules are RE2: linear time on a backtracking pattern, a clear error on deep nesting") {
  // Registers the long-named parameter under one rule with `pattern`.
  auto add_with_rule = [](const std::string& pattern) {
    ModelSpec spec;
    spec.name = "m";
    ParameterRule r;
    r.pattern = pattern;
    spec.rules.push_back(r);
    ModelRegistry registry(Precision::fp32);
    return registry.add(std::make_shared<LongName>(), spec, torch::kCPU).parameters.at(0).trainable;
  };
  // (x+x+)+y takes 2^40 steps in a backtracking engine (std::regex) on 40 x's; RE2 is linear.
  CHECK(add_with_rule("(x+x+)+y|x+"));
  // 100000 nested groups overflowed std::regex's recursive parser (SIGSEGV); RE2 parses and
  // matches without recursion.
  CHECK(add_with_rule(std::string(100000, '(') + "x+" + std::string(100000, ')')));
  CHECK_THROWS_WITH(add_with_rule("lora_(A"), Catch::Contains("parameter rule \"lora_(A\" is not a valid regex: missing )"));
}

TEST_CASE("why: under float16 autocast a promoted op refuses bfloat16 beside float16") {
  // What a frozen bfloat16 ViT met at its first fp16-mixed step (its class token joined to the
  // patch embeddings with cat): the registry now refuses the declaration instead.
  AutocastGuard autocast(c10::DeviceType::CPU, c10::kHalf, true);
  auto token = torch::zeros({1, 1, 4}, torch::kBFloat16), patches = torch::zeros({1, 3, 4}, torch::kHalf);
  CHECK_THROWS_WITH(at::cat({token, patches}, 1),
                    Catch::Contains("Unexpected floating ScalarType in at::autocast::prioritize"));
  CHECK(at::cat({token.to(torch::kHalf), patches}, 1).scalar_type() == torch::kHalf);
}

}  // namespace refit_test_model_registry
