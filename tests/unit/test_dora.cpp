// DoRA ("use_dora": true in the lora plugin) against HF PEFT 0.21.2 (tests/golden/make_dora_peft.py):
// magnitude initialisation, forward and every gradient on Linear and Conv2d (fp32; bf16 autocast
// reported), merge and unmerge, PEFT files read and written (PEFT loads refit's file completely).
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <regex>

#include "core/plugin_loader.h"
#include "io/adapter_files.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "refit/autocast.h"
#include "refit/layers.h"
#include "lora_support.h"
#include "test_support.h"

using namespace refit;
namespace fs = std::filesystem;
using namespace refit::lora_test;

namespace {

fs::path golden(const std::string& p) { return fs::path(test::source_dir()) / "tests/golden/lora/dora" / p; }




double max_rel(const torch::Tensor& a, const torch::Tensor& b) { return max_abs(a, b) / b.abs().max().item<double>(); }

struct Outcome {
  torch::Tensor y, grad_x, grad_A, grad_B, grad_m;
};

/// y = model(x) and the gradients of sum(y^2) (as the generator), optionally under CPU bf16 autocast.
Outcome run(TensorModel& model, const std::string& layer, const torch::Tensor& x_in, bool autocast) {
  model.zero_grad();
  auto x = x_in.clone().requires_grad_(true);
  torch::Tensor y;
  {
    std::optional<AutocastGuard> guard;
    if (autocast) guard.emplace(c10::DeviceType::CPU, torch::kBFloat16, true);
    y = model.forward(x);
  }
  y.to(torch::kFloat).pow(2).sum().backward();
  auto p = model.named_parameters();
  const std::string k = layer + ".lora_default.";
  return {y.detach().to(torch::kFloat), x.grad().clone(), p[k + "lora_A"].grad().clone(), p[k + "lora_B"].grad().clone(),
          p[k + "lora_magnitude_vector"].grad().clone()};
}

template <class Net>
void check_against_peft(const std::string& name, Json config, const std::string& layer) {
  Lora lora;
  auto model = std::make_shared<Net>();
  load_weights(*model, golden(name + "/base.safetensors"), name);
  auto expected = io::SafetensorsFile::open(golden(name + "/expected.safetensors"));
  const auto x = expected.load("x");
  const auto base_y = model->forward(x).detach();

  auto adapter = lora.make(config);
  adapter->attach(*model);
  auto params = model->named_parameters();
  const std::string k = layer + ".lora_default.";
  // The magnitude starts at the base weight's norms per output channel, shaped as PEFT's.
  REQUIRE(params.contains(k + "lora_magnitude_vector"));
  CHECK(params[k + "lora_magnitude_vector"].sizes() == expected.load("init_magnitude").sizes());
  CHECK(max_abs(params[k + "lora_magnitude_vector"], expected.load("init_magnitude")) <= 1e-6);
  CHECK(max_abs(model->forward(x), base_y) <= 1e-5);  // B = 0, m = ||W||: the base output
  adapter->import_files(*model, io::read_adapter_files(golden(name + "/peft")));

  // fp32: forward and every gradient (x, A, B, magnitude) within 1e-5 of PEFT's.
  const Outcome fp32 = run(*model, layer, x, false);
  std::printf("DoRA %s, fp32 vs PEFT's (max abs error): y %.2e, grad x %.2e, A %.2e, B %.2e, m %.2e\n", name.c_str(),
              max_abs(fp32.y, expected.load("y")), max_abs(fp32.grad_x, expected.load("grad_x")),
              max_abs(fp32.grad_A, expected.load("grad_A")), max_abs(fp32.grad_B, expected.load("grad_B")),
              max_abs(fp32.grad_m, expected.load("grad_m")));
  CHECK(max_abs(fp32.y, expected.load("y")) <= 1e-5);
  CHECK(max_abs(fp32.grad_x, expected.load("grad_x")) <= 1e-5);
  CHECK(max_abs(fp32.grad_A, expected.load("grad_A")) <= 1e-5);
  CHECK(max_abs(fp32.grad_B, expected.load("grad_B")) <= 1e-5);
  CHECK(max_abs(fp32.grad_m, expected.load("grad_m")) <= 1e-5);
  // The norm is detached: dropping it from the graph changes the factors' gradients (a DoRA
  // without the detach would fail the checks above; here: the gradients are not all zero).
  CHECK(fp32.grad_m.abs().sum().item<double>() > 0);

  // bf16 autocast: the same ops under autocast on both sides; the error is reported (relative to
  // the largest element of PEFT's tensor).
  const Outcome bf = run(*model, layer, x, true);
  const double e[] = {max_rel(bf.y, expected.load("y_bf16")), max_rel(bf.grad_x, expected.load("grad_x_bf16")),
                      max_rel(bf.grad_A, expected.load("grad_A_bf16")), max_rel(bf.grad_B, expected.load("grad_B_bf16")),
                      max_rel(bf.grad_m, expected.load("grad_m_bf16"))};
  std::printf("DoRA %s, CPU bf16 autocast vs PEFT's (max abs error / max abs value): y %.2e, grad x %.2e, A %.2e, B %.2e, m %.2e\n",
              name.c_str(), e[0], e[1], e[2], e[3], e[4]);
  for (double v : e) CHECK(v <= 2e-2);
  CHECK(max_abs(bf.y, fp32.y) > 1e-4);  // autocast did run in bf16 (on both sides: PEFT's y_bf16 differs too)
  CHECK(max_abs(expected.load("y_bf16"), expected.load("y")) > 1e-4);

  // Merge = PEFT's merge_and_unload weight; the output does not change; unmerge restores.
  torch::NoGradGuard ng;
  const auto weight_before = params[layer + ".weight"].clone();
  adapter->merge(*model);
  CHECK(max_abs(params[layer + ".weight"], expected.load("merged_weight")) <= 1e-6);
  CHECK(max_abs(model->forward(x), expected.load("y")) <= 1e-5);
  adapter->unmerge(*model);
  CHECK(max_abs(params[layer + ".weight"], weight_before) <= 1e-6);
  CHECK(max_abs(model->forward(x), expected.load("y")) <= 1e-5);
  adapter->set_active(*model, false);
  CHECK(max_abs(model->forward(x), base_y) <= 1e-5);
}

}  // namespace

TEST_CASE("DoRA on Linear: magnitude init, PEFT adapter loads, forward, every gradient, merge match PEFT (golden)") {
  check_against_peft<LinearNet>("linear", Json{{"r", 4}, {"alpha", 8}, {"use_dora", true}, {"target_modules", {"proj"}}},
                                "proj");
}

TEST_CASE("DoRA on Conv2d (rsLoRA): magnitude init, PEFT adapter loads, forward, every gradient, merge match PEFT (golden)") {
  check_against_peft<ConvNet>(
      "conv", Json{{"r", 2}, {"alpha", 4}, {"use_rslora", true}, {"use_dora", true}, {"target_modules", {"conv"}}}, "conv");
}

namespace {

/// refit's DoRA adapter with set factors and magnitude; the file it writes is what PEFT loaded
/// (every tensor) and gave refit's outputs for, before and after merging.
template <class Net>
void check_refit_written(const std::string& name, Json config, const std::string& layer) {
  Lora lora;
  auto model = std::make_shared<Net>();
  load_weights(*model, golden(name + "/base.safetensors"), name);
  auto adapter = lora.make(config);
  adapter->attach(*model);
  {
    torch::NoGradGuard ng;
    auto p = model->named_parameters();
    const std::string k = layer + ".lora_default.";
    for (const char* f : {"lora_A", "lora_B"}) {
      auto t = p[k + f];
      t.copy_(torch::linspace(-0.6, 0.6, t.numel()).reshape(t.sizes()) * (std::string(f) == "lora_A" ? 1 : -1));
    }
    auto m = p[k + "lora_magnitude_vector"];
    m.mul_(torch::linspace(0.8, 1.3, m.numel()).reshape(m.sizes()));
  }
  AdapterFiles files = adapter->export_files(*model);
  CHECK(files.config["use_dora"] == true);
  CHECK(files.tensors.size() == 3);
  CHECK(files.tensors.count("base_model.model." + layer + ".lora_magnitude_vector") == 1);
  const auto x = io::SafetensorsFile::open(golden(name + "/expected.safetensors")).load("x");
  torch::NoGradGuard ng;
  const auto y = model->forward(x);
  adapter->merge(*model);
  const auto merged_y = model->forward(x);
  adapter->unmerge(*model);
  if (std::getenv("REFIT_REGENERATE_GOLDEN")) {
    io::write_adapter_files(golden(name + "/refit_written"), files);
    io::save_safetensors(golden(name + "/refit_written/refit_output.safetensors"), {{"y", y}, {"merged_y", merged_y}}, {});
  }
  auto verified = io::read_adapter_files(golden(name + "/refit_written"));
  CHECK(verified.config == files.config);
  REQUIRE(verified.tensors.size() == files.tensors.size());
  for (const auto& kv : files.tensors) CHECK(torch::equal(verified.tensors.at(kv.first), kv.second));
  auto peft = io::SafetensorsFile::open(golden(name + "/refit_written/peft_output.safetensors"));
  CHECK(max_abs(y, peft.load("y")) <= 1e-5);
  CHECK(max_abs(merged_y, peft.load("merged_y")) <= 1e-5);
  // And refit reads its own file back.
  auto again = std::make_shared<Net>();
  load_weights(*again, golden(name + "/base.safetensors"), name);
  auto other = lora.make(config);
  other->attach(*again);
  other->import_files(*again, verified);
  CHECK(max_abs(again->forward(x), y) == 0);
}

}  // namespace

TEST_CASE("DoRA: refit writes PEFT files that PEFT loads completely, to refit's outputs before and after merge (golden)") {
  check_refit_written<LinearNet>("linear", Json{{"r", 4}, {"alpha", 8}, {"use_dora", true}, {"target_modules", {"proj"}}},
                                 "proj");
  check_refit_written<ConvNet>(
      "conv", Json{{"r", 2}, {"alpha", 4}, {"use_rslora", true}, {"use_dora", true}, {"target_modules", {"conv"}}}, "conv");
}

TEST_CASE("DoRA files: use_dora must agree between the file and the recipe") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  auto plain = lora.make(Json{{"r", 4}, {"alpha", 8}, {"target_modules", {"proj"}}});
  plain->attach(*model);
  CHECK_THROWS_WITH(plain->import_files(*model, io::read_adapter_files(golden("linear/peft"))),
                    Catch::Contains("use_dora: file true, recipe false"));
  auto dora = lora.make(Json{{"name", "d"}, {"r", 4}, {"alpha", 8}, {"use_dora", true}, {"target_modules", {"proj"}}});
  dora->attach(*model);
  AdapterFiles files = io::read_adapter_files(golden("linear/peft"));
  files.config.erase("use_dora");
  CHECK_THROWS_WITH(dora->import_files(*model, files), Catch::Contains("use_dora: file false (or absent), recipe true"));
  files.config["use_dora"] = true;
  files.tensors.erase("base_model.model.proj.lora_magnitude_vector");
  CHECK_THROWS_WITH(dora->import_files(*model, files),
                    Catch::Contains("no base_model.model.proj.lora_magnitude_vector"));
  auto rule = dora->parameter_rules().at(0);
  CHECK(std::regex_match(std::string("proj.lora_d.lora_magnitude_vector"), std::regex(rule.pattern)));
}

TEST_CASE("DoRA with a LoRA on the same layer: merged in attachment order the output does not change, unmerged last first") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  load_weights(*model, golden("linear/base.safetensors"), "linear");
  auto first = lora.make(Json{{"name", "plain"}, {"r", 2}, {"alpha", 2}, {"target_modules", {"proj"}}});
  auto dora = lora.make(Json{{"r", 4}, {"alpha", 8}, {"use_dora", true}, {"target_modules", {"proj"}}});
  first->attach(*model);
  dora->attach(*model);
  dora->import_files(*model, io::read_adapter_files(golden("linear/peft")));
  torch::NoGradGuard ng;
  auto p = model->named_parameters();
  p["proj.lora_plain.lora_B"].copy_(torch::linspace(-0.5, 0.5, 12).reshape({6, 2}));
  const auto x = torch::linspace(-2, 2, 40).reshape({5, 8});
  const auto y = model->forward(x).clone(), w = p["proj.weight"].clone();
  first->merge(*model);
  dora->merge(*model);  // its norm is taken on the weight without "plain" (as PEFT's _unmerged_base_weight)
  CHECK(max_abs(model->forward(x), y) <= 1e-5);
  CHECK_THROWS_WITH(first->unmerge(*model), Catch::Contains("unmerge \"lora_default\" from \"proj\" first"));
  dora->unmerge(*model);
  first->unmerge(*model);
  CHECK(max_abs(p["proj.weight"], w) <= 1e-5);
  CHECK(max_abs(model->forward(x), y) <= 1e-5);
}

TEST_CASE("DoRA with dropout in training: the base product is recomputed without bias on the dropped input, as PEFT") {
  Lora lora;
  auto model = std::make_shared<LinearNet>();
  load_weights(*model, golden("linear/base.safetensors"), "linear");
  auto adapter = lora.make(Json{{"r", 4}, {"alpha", 8}, {"use_dora", true}, {"dropout", 0.5}, {"target_modules", {"proj"}}});
  adapter->attach(*model);
  adapter->import_files(*model, io::read_adapter_files(golden("linear/peft")));
  model->train();
  torch::NoGradGuard ng;
  auto p = model->named_parameters();
  const auto W = p["proj.weight"], b = p["proj.bias"], A = p["proj.lora_default.lora_A"], B = p["proj.lora_default.lora_B"];
  const auto m = p["proj.lora_default.lora_magnitude_vector"];
  const auto x = torch::linspace(-2, 2, 40).reshape({5, 8});
  torch::manual_seed(3);
  const auto y = model->forward(x);
  torch::manual_seed(3);
  const auto xd = torch::dropout(x, 0.5, true);  // the layer's only random draw
  const double s = 2.0;
  const auto scale = (m / at::linalg_vector_norm(W + s * at::matmul(B, A), 2, {1})).view({1, -1});
  // PEFT's DoraLinearLayer.forward with base_result = None: F.linear(x, W) (no bias) on the dropped x.
  const auto expected = at::linear(x, W, b) + (scale - 1) * at::linear(xd, W) + scale * at::linear(at::linear(xd, A), B) * s;
  CHECK(max_abs(y, expected) <= 1e-5);
  CHECK(max_abs(xd, x) > 0.1);  // something was dropped
  model->eval();  // no dropout: the same formula on x itself
  CHECK(max_abs(model->forward(x), at::linear(x, W, b) + (scale - 1) * at::linear(x, W) + scale * at::linear(at::linear(x, A), B) * s) <= 1e-5);
}
