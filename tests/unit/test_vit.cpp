// The vision plugin's "vit" (DINOv2 architecture) against HF transformers' Dinov2Model and
// Dinov2WithRegistersModel (tests/golden/make_dinov2.py): their checkpoint files load with strict
// key matching, and the outputs match in fp64, fp32, under bf16 autocast and with bf16 weights, at the
// trained image size and at sizes that interpolate the position embeddings. LoRA attaches to the
// attention projections; "linear_head" chains after the backbone. PEFT adapters use
// transformers' in-memory names (tests/golden/make_lora_vit.py): PEFT's load, refit's written
// ones load completely in PEFT.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include <ATen/Parallel.h>

#include "core/plugin_loader.h"
#include "io/adapter_files.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "precision/autocast_guard.h"
#include "data_support.h"
#include "refit/module_names.h"
#include "numeric_bounds.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_vit {

using namespace refit;
using namespace refit::test;
namespace fs = std::filesystem;

namespace {

fs::path golden(const std::string& p) { return fs::path(test::source_dir()) / "tests/golden/dinov2" / p; }

Json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in);
  return Json::parse(in);
}

double max_abs(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max().item<double>();
}

/// The models and adapters of the real plugins.
struct Plugins {
  Registry registry;
  PluginLoader loader{registry};
  Plugins() {
    loader.load("vision");
    loader.load("lora");
  }
  std::shared_ptr<TensorModel> model(const std::string& type, Json config) {
    auto issues = std::make_shared<ConfigIssues>();
    auto build = registry.models.parse(type, "/type", ConfigReader(std::move(config), "/config", issues));
    if (!issues->empty()) FAIL(ConfigError(issues->list()).what());
    return test::tensor_model(build(BuildContext{}));
  }
  AdapterPtr adapter(const std::string& type, Json config) {
    auto issues = std::make_shared<ConfigIssues>();
    auto build = registry.adapters.parse(type, "/type", ConfigReader(std::move(config), "/config", issues));
    if (!issues->empty()) FAIL(ConfigError(issues->list()).what());
    return build(BuildContext{});
  }
  /// The problems a config has (empty when it parses).
  std::vector<ConfigIssue> issues(const std::string& type, Json config) {
    auto issues = std::make_shared<ConfigIssues>();
    registry.models.parse(type, "/type", ConfigReader(std::move(config), "/config", issues));
    return issues->list();
  }
};

const char* const kSizes[] = {"16x16", "24x20", "27x22"};

double mean_abs(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().mean().item<double>();
}

/// The depth n (numeric_bounds.h) of a DINOv2 forward at an input of x's size: the reduction
/// lengths and elementwise roundings along its longest path. The net is not a polynomial
/// (LayerNorm, softmax, GELU), so the bound built from it is first-order: each op's relative
/// error counted once, relative to the output's largest magnitude.
struct VitDepth {
  std::int64_t fp32 = 0;  // fp32 roundings (reductions and elementwise ops)
  std::int64_t bf16 = 0;  // bf16 roundings (casts and outputs), with bf16 products or bf16 weights
};

VitDepth vit_depth(const Json& config, const torch::Tensor& x, std::int64_t lora_rank = 0) {
  const std::int64_t H = config.at("hidden_size"), L = config.at("num_hidden_layers"), p = config.at("patch_size");
  const std::int64_t C = config.value("num_channels", 3), heads = config.at("num_attention_heads");
  const std::int64_t mlp = static_cast<std::int64_t>(config.value("mlp_ratio", 4.0) * H);
  const std::int64_t T = 1 + config.value("num_register_tokens", 0) + (x.size(-2) / p) * (x.size(-1) / p);
  const std::int64_t dh = H / heads;
  // A LoRA on a Linear of K inputs adds its path: K (A) + r (B) + 3 (scaling, multiply, sum).
  auto lora = [&](std::int64_t K) { return lora_rank > 0 ? K + lora_rank + 3 : 0; };
  VitDepth n;
  // Embeddings: the patch projection (K = C p^2, bias), bicubic interpolation of the position
  // embeddings (4 x 4 taps: 16 products summed, 2 passes) and the adds.
  n.fp32 = C * p * p + 1 + lora(C * p * p) + 2 * 16 + 2;
  // Per layer: LayerNorm (mean and variance over H, normalise, affine: 2H + 4), q/k/v (H + 1),
  // scores (d_h + 1 for the scale), softmax (max, exp, sum over T, divide: T + 3), context (T),
  // output projection (H + 1), layer scale and residual (2), LayerNorm (2H + 4), fc1 (H + 1),
  // GELU (3), fc2 (mlp + 1), layer scale and residual (2).
  const std::int64_t layer = (2 * H + 4) + (H + 1) + lora(H) + (dh + 1) + (T + 3) + T + (H + 1) + lora(H) + 2 + (2 * H + 4) +
                             (H + 1) + lora(H) + 3 + (mlp + 1) + lora(mlp) + 2;
  // Final LayerNorm (2H + 4) and the mean over the patch tokens (T + 1).
  n.fp32 += L * layer + (2 * H + 4) + (T + 1);
  // bf16: each of the six products on the path (q/k/v, scores, context, output, fc1, fc2) rounds
  // its two operands and its result (3; with bf16 weights fewer, counted the same); eight
  // elementwise results per layer (2 LayerNorms, softmax, GELU, 2 layer scales, 2 residual adds).
  // Embeddings: the input, the patch projection (3), the position embeddings and their add (2),
  // the final LayerNorm and the pooling (2).
  n.bf16 = L * (6 * 3 + 8) + 1 + 3 + 2 + 2;
  return n;
}

/// max |y - exact| / (bound * max |exact|): <= 1 passes.
double first_order_ratio(const torch::Tensor& y, const torch::Tensor& exact, double relative) {
  return max_abs(y, exact) / (relative * exact.abs().max().item<double>());
}

/// Runs the golden case `name` in every output mode, size and precision; returns the largest
/// difference seen per precision.
///
/// The reference is the exact forward (refit's model in double, from the same weights and
/// inputs); refit's results and transformers' (the fixtures, computed on another CPU) must both
/// be within the derived bound of it:
///   fp32: max |y - exact| <= gamma_{n32}(2^-24) * max |exact|;
///   bf16 (autocast or bf16 weights): max |y - exact| <= (gamma_{n16}(2^-8) + gamma_{n32}(2^-24)) * max |exact|,
/// with n32 and n16 from vit_depth. bf16 is really in use: its mean distance from the exact
/// output is above an eighth of one rounding's (a rounding to bf16 moves a value by u/4 to u/2
/// relative on average; an fp32 forward is 2^16 times closer).
std::map<std::string, double> check_against_transformers(const std::string& name) {
  Plugins plugins;
  auto expected = io::SafetensorsFile::open(golden(name + "/expected.safetensors"));
  Json config = read_json(golden(name + "/refit_config.json"));
  std::map<std::string, double> worst;
  for (const std::string output : {"tokens", "cls", "cls_mean"}) {
    config["output"] = output;
    auto model = plugins.model("vit", config);
    load_weights(*model, golden(name + "/model.safetensors"), "vit");  // strict: every key, every shape
    model->eval();
    auto exact_model = plugins.model("vit", config);
    load_weights(*exact_model, golden(name + "/model.safetensors"), "vit");
    exact_model->eval();
    exact_model->to(torch::kDouble);
    torch::NoGradGuard ng;
    auto check = [&](const std::string& precision, const std::string& size, const torch::Tensor& y, const torch::Tensor& x) {
      const torch::Tensor exact = exact_model->forward(x.to(torch::kDouble));
      const VitDepth n = vit_depth(config, x);
      const bool fp32 = precision == "fp32";
      const double relative = fp32 ? prob_depth_bound(n.fp32, torch::kFloat)
                                   : prob_depth_bound(n.bf16, torch::kBFloat16) + prob_depth_bound(n.fp32, torch::kFloat);
      const torch::Tensor theirs = expected.load(output + "_" + precision + "_" + size);
      const double ours = first_order_ratio(y, exact, relative), python = first_order_ratio(theirs, exact, relative);
      INFO(name << " output " << output << " " << precision << " " << size << ": max |refit - exact| / bound " << ours
                << ", transformers' " << python << " (n32 " << n.fp32 << ", n16 " << n.bf16 << ", bound "
                << relative * exact.abs().max().item<double>() << ")");
      check_bound_ratio(name + " " + precision + ": refit", ours);
      check_bound_ratio(name + " " + precision + ": transformers", python);
      worst[precision] = std::max(worst[precision], max_abs(y, theirs));
      worst[precision + " / bound"] = std::max(worst[precision + " / bound"], ours);
      if (fp32) return;
      // bf16 is really in use: the result is bf16's distance away from the exact one.
      const double gap = mean_abs(y, exact);
      CHECK(gap > kUnitBf16 / 8 * exact.abs().mean().item<double>());
      worst[precision + " vs fp32"] =
          std::max(worst[precision + " vs fp32"], max_abs(y, expected.load(output + "_fp32_" + size)));
    };
    {
      // transformers' float64 forward is a second exact value (at the trained size: transformers
      // interpolates position embeddings in float32 whatever the dtype): both are within
      // gamma~_{n32}(2^-53) max |exact| of the true value, so within twice that of each other. Any
      // difference in the function computed (an epsilon, a scale, a skipped term) is far larger.
      const torch::Tensor x = expected.load("x_16x16");
      const torch::Tensor exact = exact_model->forward(x.to(torch::kDouble));
      const double bound = 2 * prob_gamma(vit_depth(config, x).fp32, kUnitFp64) * exact.abs().max().item<double>();
      const double err = (expected.load(output + "_fp64_16x16") - exact).abs().max().item<double>();
      check_bound_ratio(name + " fp64: transformers vs refit", err / bound);
    }
    for (const char* size : kSizes) {
      const torch::Tensor x = expected.load(std::string("x_") + size);
      check("fp32", size, model->forward(x), x);
      AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
      const torch::Tensor y = model->forward(x);
      CHECK(y.scalar_type() == torch::kFloat32);  // LayerNorm output: float32 under CPU autocast
      check("bf16", size, y, x);
    }
    // A frozen bf16 backbone: weights in bfloat16, without and with autocast.
    model->to(torch::kBFloat16);
    for (const char* size : kSizes) {
      const torch::Tensor x = expected.load(std::string("x_") + size);
      const torch::Tensor y = model->forward(x);
      CHECK(y.scalar_type() == torch::kBFloat16);
      check("bf16w", size, y, x);
      AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
      check("bf16w_autocast", size, model->forward(x), x);
    }
  }
  for (const auto& kv : worst) std::cout << "vit golden " << name << ": " << kv.first << " max diff " << kv.second << "\n";
  return worst;
}

Json tiny_config() {
  return Json{{"image_size", 16},         {"patch_size", 4},         {"hidden_size", 32},   {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"layerscale_value", 0.5}, {"output", "cls_mean"}};
}

}  // namespace

TEST_CASE("vit matches transformers' Dinov2Model: fp32, bf16, interpolated position embeddings (golden)") {
  check_against_transformers("plain");
}

TEST_CASE("vit with register tokens matches transformers' Dinov2WithRegistersModel (golden)") {
  check_against_transformers("registers");
}

TEST_CASE("vit: parameter names are Dinov2Model's checkpoint keys, a mismatched config is refused") {
  Plugins plugins;
  auto model = plugins.model("vit", read_json(golden("plain/refit_config.json")));
  auto file = io::SafetensorsFile::open(golden("plain/model.safetensors"));
  auto state = model_state(*model);
  std::set<std::string> names, keys;
  for (const auto& kv : state) names.insert(kv.first);
  for (const auto& t : file.tensors()) keys.insert(t.name);
  CHECK(names == keys);
  CHECK(names.count("encoder.layer.1.attention.attention.query.weight") == 1);
  CHECK(names.count("encoder.layer.0.attention.output.dense.bias") == 1);
  CHECK(names.count("encoder.layer.0.layer_scale2.lambda1") == 1);
  CHECK(names.count("embeddings.patch_embeddings.projection.weight") == 1);
  CHECK(state.at("embeddings.mask_token").sizes() == torch::IntArrayRef({1, 32}));
  CHECK(state.at("embeddings.position_embeddings").sizes() == torch::IntArrayRef({1, 17, 32}));

  // Without qkv bias / without the mask token / with registers: names follow.
  Json c = tiny_config();
  c["qkv_bias"] = false, c["use_mask_token"] = false, c["num_register_tokens"] = 3;
  auto other = model_state(*plugins.model("vit", c));
  CHECK(other.count("encoder.layer.0.attention.attention.key.bias") == 0);
  CHECK(other.count("encoder.layer.0.attention.output.dense.bias") == 1);
  CHECK(other.count("embeddings.mask_token") == 0);
  CHECK(other.at("embeddings.register_tokens").sizes() == torch::IntArrayRef({1, 3, 32}));

  // A config that does not describe the file: strict loading names what differs.
  Json wrong = read_json(golden("plain/refit_config.json"));
  wrong["num_hidden_layers"] = 3;
  auto deeper = plugins.model("vit", wrong);
  CHECK_THROWS_WITH(load_weights(*deeper, golden("plain/model.safetensors"), "vit"),
                    Catch::Contains("missing from the file (18)") &&
                        Catch::Contains("encoder.layer.2.attention.attention.query.weight [32, 32]"));
}

TEST_CASE("vit: LoRA attaches to the attention projections, output unchanged at init") {
  Plugins plugins;
  auto model = plugins.model("vit", read_json(golden("plain/refit_config.json")));
  load_weights(*model, golden("plain/model.safetensors"), "vit");
  model->eval();
  const torch::Tensor x = io::SafetensorsFile::open(golden("plain/expected.safetensors")).load("x_24x20");
  const torch::Tensor before = model->forward(x).detach();

  auto lora =
      plugins.adapter("lora", Json{{"r", 4},
                                   {"alpha", 8},
                                   {"target_regex", "encoder\\.layer\\.[0-9]+\\.attention\\.attention\\.(query|value)"}});
  lora->attach(*model);
  auto params = model->named_parameters();
  std::vector<std::string> factors;
  for (const auto& p : params)
    if (p.key().find(".lora_default.") != std::string::npos) factors.push_back(p.key());
  CHECK(factors.size() == 8);  // 2 layers x {query, value} x {A, B}
  REQUIRE(params.contains("encoder.layer.1.attention.attention.value.lora_default.lora_B"));
  CHECK(params.find("encoder.layer.0.attention.attention.key.lora_default.lora_A") == nullptr);
  CHECK(params["encoder.layer.0.attention.attention.query.lora_default.lora_A"].sizes() == torch::IntArrayRef({4, 32}));

  // B = 0: exactly the base model.
  CHECK(torch::equal(model->forward(x), before));
  // The factors are on the path: a non-zero B changes the output, and gradients reach A and B.
  {
    torch::NoGradGuard ng;
    params["encoder.layer.1.attention.attention.value.lora_default.lora_B"].fill_(0.1);
  }
  const torch::Tensor after = model->forward(x);
  CHECK(max_abs(after, before) > 1e-3);
  after.pow(2).sum().backward();
  CHECK(params["encoder.layer.1.attention.attention.value.lora_default.lora_A"].grad().abs().sum().item<double>() > 0);
  lora->set_active(*model, false);
  CHECK(max_abs(model->forward(x), before) <= 1e-6);
}

TEST_CASE("vit: output modes, linear_head chaining, config errors") {
  Plugins plugins;
  Json c = tiny_config();
  auto backbone = plugins.model("vit", c);
  auto head = plugins.model("linear_head", Json{{"in_features", 64}, {"out_features", 10}});
  auto head_params = head->named_parameters();
  CHECK(head_params.size() == 2);
  CHECK(head_params.contains("linear.weight"));
  CHECK(head_params.contains("linear.bias"));
  const torch::Tensor x = torch::randn({3, 3, 20, 28});
  const torch::Tensor features = backbone->forward(x);
  CHECK(features.sizes() == torch::IntArrayRef({3, 64}));  // cls_mean: 2 x hidden
  CHECK(head->forward(features).sizes() == torch::IntArrayRef({3, 10}));
  CHECK_THROWS_WITH(head->forward(torch::randn({3, 32})), Catch::Contains("expected features [..., 64]"));
  c["output"] = "tokens", c["num_register_tokens"] = 2;
  CHECK(plugins.model("vit", c)->forward(x).sizes() == torch::IntArrayRef({3, 1 + 2 + 5 * 7, 32}));
  CHECK_THROWS_WITH(backbone->forward(torch::randn({2, 1, 16, 16})), Catch::Contains("expected pixel values [batch, 3"));

  Json bad = tiny_config();
  bad["num_attention_heads"] = 5, bad["output"] = "cls_means", bad["patch_size"] = 32, bad["layer_norm_eps"] = 0.0;
  bad["hidden_sise"] = 8;
  auto issues = plugins.issues("vit", bad);
  CHECK(test::message_at(issues, "/config/num_attention_heads") == "expected a divisor of hidden_size (32), got 5");
  CHECK_THAT(test::message_at(issues, "/config/output"), Catch::Contains("did you mean \"cls_mean\""));
  CHECK(test::message_at(issues, "/config/patch_size") == "expected at most image_size (16), got 32");
  CHECK(test::message_at(issues, "/config/layer_norm_eps") == "expected a positive value");
  CHECK_THAT(test::message_at(issues, "/config/hidden_sise"), Catch::Contains("did you mean \"hidden_size\""));
  auto head_issues = plugins.issues("linear_head", Json{{"in_features", 0}});
  CHECK(test::message_at(head_issues, "/config/out_features") == "missing required key");
  CHECK_THAT(test::message_at(head_issues, "/config/in_features"), Catch::Contains("expected a value in [1,"));
}

// Not run by default (hidden): the forward time of a small ViT on this machine.
TEST_CASE("vit: forward time, patch 4, 28x28, hidden 64, 4 layers, batch 128", "[.][bench]") {
  Plugins plugins;
  auto model = plugins.model("vit", Json{{"image_size", 28},
                                         {"patch_size", 4},
                                         {"num_channels", 1},
                                         {"hidden_size", 64},
                                         {"num_hidden_layers", 4},
                                         {"num_attention_heads", 4},
                                         {"output", "cls"}});
  model->eval();
  torch::NoGradGuard ng;
  const torch::Tensor x = torch::randn({128, 1, 28, 28});
  for (const bool bf16 : {false, true}) {
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
    for (int i = 0; i < 3; ++i) model->forward(x);
    const int n = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) model->forward(x);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
    std::cout << "vit forward (" << (bf16 ? "bf16 autocast" : "fp32") << ", " << at::get_num_threads() << " threads): " << ms
              << " ms per batch of 128\n";
  }
}

namespace {

fs::path lora_golden(const std::string& p) { return fs::path(test::source_dir()) / "tests/golden/lora/vit" / p; }

/// The tiny Dinov2Model of dinov2/plain with LoRA r = 2, alpha = 4 on every Linear / Conv2d
/// (13 layers), as tests/golden/make_lora_vit.py adapts transformers' model.
std::pair<std::shared_ptr<TensorModel>, AdapterPtr> vit_with_lora(Plugins& plugins) {
  auto model = plugins.model("vit", read_json(golden("plain/refit_config.json")));
  load_weights(*model, golden("plain/model.safetensors"), "vit");
  model->eval();
  auto lora = plugins.adapter("lora", Json{{"r", 2}, {"alpha", 4}, {"target_regex", ".*"}});
  lora->attach(*model);
  return {model, lora};
}

/// Each of `results` (refit's and PEFT's forwards of the LoRA ViT with `files`) is within
/// gamma_{n32}(2^-24) * max |exact| of the exact forward (refit's model in double).
void check_lora_vit(const std::string& what, const AdapterFiles& files, const torch::Tensor& x,
                    const std::vector<std::pair<std::string, torch::Tensor>>& results) {
  Plugins plugins;
  auto [model, lora] = vit_with_lora(plugins);
  lora->import_files(*model, files);
  model->to(torch::kDouble);
  torch::NoGradGuard ng;
  const auto exact = model->forward(x.to(torch::kDouble));
  const VitDepth n = vit_depth(read_json(golden("plain/refit_config.json")), x, /*lora_rank=*/2);
  const double relative = prob_depth_bound(n.fp32, torch::kFloat);
  for (const auto& [who, y] : results) {
    const double ratio = first_order_ratio(y, exact, relative);
    std::cout << "vit LoRA " << what << ": " << who << " max |y - exact| / bound " << ratio << " (n " << n.fp32 << ")\n";
    check_bound_ratio(what + ": " + who, ratio);
  }
}

}  // namespace

TEST_CASE("vit: module renames map the file names to transformers' in-memory names and back") {
  Plugins plugins;
  auto model = plugins.model("vit", read_json(golden("plain/refit_config.json")));
  const auto renames = model->module_renames();
  REQUIRE(renames.size() == 4);
  CHECK(rename_module_path("encoder.layer.0.attention.attention.query", renames) == "encoder.layer.0.attention.q_proj");
  CHECK(rename_module_path("encoder.layer.11.attention.output.dense", renames) == "encoder.layer.11.attention.o_proj");
  CHECK(rename_module_path("base_model.model.encoder.layer.1.attention.attention.value.lora_A.weight", renames) ==
        "base_model.model.encoder.layer.1.attention.v_proj.lora_A.weight");
  CHECK(rename_module_path("encoder.layer.0.mlp.fc1", renames) == "encoder.layer.0.mlp.fc1");
  CHECK(rename_module_path("xattention.attention.query", renames) == "xattention.attention.query");  // whole components only
  CHECK(rename_module_path("encoder.layer.0.attention.k_proj", renames, /*to_memory=*/false) ==
        "encoder.layer.0.attention.attention.key");
}

TEST_CASE("vit: PEFT's adapter from transformers' Dinov2Model loads under either naming, output matches PEFT (golden)") {
  Plugins plugins;
  auto expected = io::SafetensorsFile::open(lora_golden("expected.safetensors"));
  const auto x = expected.load("x");
  auto files = io::read_adapter_files(lora_golden("peft"));
  REQUIRE(files.tensors.size() == 26);
  CHECK(files.tensors.count("base_model.model.encoder.layer.0.attention.q_proj.lora_A.weight") == 1);

  auto [model, lora] = vit_with_lora(plugins);
  lora->import_files(*model, files);
  const auto y = model->forward(x).detach();
  const double err = max_abs(y, expected.load("y"));
  std::cout << "vit LoRA: PEFT-written adapter, refit vs PEFT max abs error " << err << "\n";
  // Both within the fp32 bound of the exact forward (double, same weights and factors; vit_depth
  // with the 13 LoRA paths, r = 2).
  check_lora_vit("PEFT-written", files, x, {{"refit", y}, {"PEFT", expected.load("y")}});

  // The same factors keyed by the file names (as refit wrote them before it knew the in-memory
  // names) load to the same model.
  const auto renames = model->module_renames();
  AdapterFiles by_file{{}, files.config};
  for (const auto& kv : files.tensors) by_file.tensors[rename_module_path(kv.first, renames, false)] = kv.second;
  CHECK(by_file.tensors.count("base_model.model.encoder.layer.0.attention.attention.query.lora_A.weight") == 1);
  auto [model2, lora2] = vit_with_lora(plugins);
  lora2->import_files(*model2, by_file);
  CHECK(torch::equal(model2->forward(x), y));

  // Both names for one layer: refused, not guessed.
  auto both = files;
  both.tensors["base_model.model.encoder.layer.1.attention.attention.key.lora_A.weight"] =
      files.tensors.at("base_model.model.encoder.layer.1.attention.k_proj.lora_A.weight");
  auto [model3, lora3] = vit_with_lora(plugins);
  CHECK_THROWS_WITH(lora3->import_files(*model3, both), Catch::Contains("under both of its names"));
}

TEST_CASE("vit: refit writes a PEFT adapter that PEFT loads completely onto transformers' Dinov2Model (golden)") {
  Plugins plugins;
  auto [model, lora] = vit_with_lora(plugins);
  {
    // Factors of their own (not PEFT's), deterministic.
    torch::NoGradGuard ng;
    double k = 1;
    for (auto& p : model->named_parameters())
      if (p.key().find(".lora_default.") != std::string::npos) {
        auto& t = p.value();
        t.copy_((torch::arange(t.numel(), torch::kFloat) * 0.37 * k + k).sin().reshape(t.sizes()) * 0.3);
        k += 1;
      }
  }
  const auto x = io::SafetensorsFile::open(lora_golden("expected.safetensors")).load("x");
  AdapterFiles files = lora->export_files(*model);
  REQUIRE(files.tensors.size() == 26);  // 2 layers x (q, k, v, o, fc1, fc2) + the patch projection, A and B
  for (const auto& kv : files.tensors) {
    INFO(kv.first);
    CHECK(kv.first.find("attention.attention.") == std::string::npos);
    CHECK(kv.first.find("attention.output.dense") == std::string::npos);
  }
  CHECK(files.tensors.count("base_model.model.encoder.layer.1.attention.o_proj.lora_B.weight") == 1);
  const auto targets = files.config["target_modules"].get<std::vector<std::string>>();
  CHECK(targets.size() == 13);
  CHECK(std::count(targets.begin(), targets.end(), "encoder.layer.0.attention.v_proj") == 1);
  CHECK(std::count(targets.begin(), targets.end(), "embeddings.patch_embeddings.projection") == 1);

  torch::Tensor y, merged_y;
  {
    torch::NoGradGuard ng;
    y = model->forward(x);
    lora->merge(*model);
    merged_y = model->forward(x);
    lora->unmerge(*model);
  }
  if (std::getenv("REFIT_REGENERATE_GOLDEN")) {
    io::write_adapter_files(lora_golden("refit_written"), files);
    io::save_safetensors(lora_golden("refit_written/refit_output.safetensors"), {{"y", y}, {"merged_y", merged_y}},
                         {{"format", "pt"}});
  }
  // What PEFT loaded completely (asserted by the generator) is exactly what refit writes today.
  auto verified = io::read_adapter_files(lora_golden("refit_written"));
  CHECK(verified.config == files.config);
  REQUIRE(verified.tensors.size() == files.tensors.size());
  for (const auto& kv : files.tensors) CHECK(torch::equal(verified.tensors.at(kv.first), kv.second));
  // And PEFT's outputs with it, before and after merge_and_unload, are refit's.
  auto peft = io::SafetensorsFile::open(lora_golden("refit_written/peft_output.safetensors"));
  const double err = max_abs(y, peft.load("y")), merged_err = max_abs(merged_y, peft.load("merged_y"));
  std::cout << "vit LoRA: refit-written adapter, refit vs PEFT max abs error " << err << ", merged " << merged_err << "\n";
  // All four within the fp32 bound of the exact forward (merging moves the LoRA product into the
  // weight: depth r + 3 within the LoRA path's K + r + 3 already counted).
  check_lora_vit(
      "refit-written", files, x,
      {{"refit", y}, {"refit merged", merged_y}, {"PEFT", peft.load("y")}, {"PEFT merged", peft.load("merged_y")}});
  // refit reads its own file back.
  auto [model2, lora2] = vit_with_lora(plugins);
  lora2->import_files(*model2, files);
  CHECK(torch::equal(model2->forward(x), y));
}

}  // namespace refit_test_vit
