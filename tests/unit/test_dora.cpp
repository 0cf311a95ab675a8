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

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_dora {

using namespace refit;
namespace fs = std::filesystem;
using namespace refit::lora_test;

namespace {

fs::path golden(const std::string& p) { return fs::path(test::source_dir()) / "tests/golden/lora/dora" / p; }


struct Outcome {
  torch::Tensor y, grad_x, grad_A, grad_B, grad_m;
};

/// PEFT's DoRA layer (DoraLinearVariant / DoraConv2dVariant, no dropout) in double from the same
/// inputs: y = base(x; W) + b + (scale - 1) base(x; W) + scale lora_B(lora_A(x)) s, with
/// scale = m / ||W + s B A|| per output channel (the norm detached); and the gradients of sum(y^2).
/// With `absolute`: P(|inputs|) of numeric_bounds.h, the same program on |x|, |W|, |b|, |A|, |B|
/// and |scale| (the computed scale enters as an input with its own relative error, its depth
/// counted in DoraDepth), (scale - 1) turned into (|scale| + 1).
Outcome dora_exact(const LoraLayer& l, const torch::Tensor& m_in, const torch::Tensor& x_in, bool absolute) {
  auto d = [&](const torch::Tensor& t) {
    auto v = t.detach().to(torch::kDouble);
    return absolute ? v.abs() : v;
  };
  auto x = d(x_in).requires_grad_(true), A = d(l.A).requires_grad_(true), B = d(l.B).requires_grad_(true);
  auto m = d(m_in).requires_grad_(true);
  const auto W = d(l.W), b = d(l.b);
  const std::int64_t out = W.size(0), r = l.rank();
  torch::Tensor norm;
  {
    torch::NoGradGuard ng;  // PEFT detaches the norm (and the B A it is taken from)
    const auto V = l.W.detach().to(torch::kDouble) + l.scaling * at::mm(l.B.detach().to(torch::kDouble).reshape({out, r}),
                                                                        l.A.detach().to(torch::kDouble).reshape({r, -1}))
                                                                     .reshape(W.sizes());
    norm = V.reshape({out, -1}).norm(2, {1});
  }
  auto scale = m.reshape({-1}) / norm;  // non-negative inputs give |scale|
  scale = l.conv ? scale.view({1, -1, 1, 1}) : scale.view({1, -1});
  const auto base = l.conv ? at::conv2d(x, W, {}, l.stride, l.padding, l.dilation) : at::linear(x, W);
  const auto lora = l.conv ? at::conv2d(at::conv2d(x, A, {}, l.stride, l.padding), B) : at::linear(at::linear(x, A), B);
  const auto bias = l.conv ? b.view({1, -1, 1, 1}) : b;
  const auto y = base + bias + (absolute ? scale + 1 : scale - 1) * base + scale * lora * l.scaling;
  (y * y).sum().backward();
  return {y.detach(), x.grad(), A.grad(), B.grad(), m.grad().reshape(m_in.sizes())};
}

/// The depths (numeric_bounds.h) of DoRA's fp32 results, and the bf16 roundings under autocast.
struct DoraDepth {
  std::int64_t scale, y, grad, merge, unmerge, y16, grad16;
};

DoraDepth dora_depth(const LoraLayer& l, const torch::Tensor& x) {
  const std::int64_t K = l.k_base(), r = l.rank(), out = l.W.size(0);
  const std::int64_t positions = x.numel() / (l.conv ? x.size(1) : x.size(-1));
  DoraDepth n;
  // The scale m / ||W + s B A||: B A (r), times s (2), the sum (1), squares (1) summed (K), the
  // square root (1), the division (1).
  n.scale = r + 2 + 1 + 1 + K + 1 + 1;
  // y: the base product (K), its bias added and taken off again (2), the LoRA path (K + r + 2:
  // lora_A, lora_B, the scaling), the scale's own depth, (scale - 1), the two products and the
  // two sums (5).
  n.y = K + 2 + K + r + 2 + n.scale + 5;
  // Gradients: dL/dy = 2y (exact), the products by the scale and s (3), then the longest
  // reduction chain back to a factor or the input: through the output channels (out, for the
  // input also the kernel: out K / C_in <= out K), and over the positions (P) with an operand of
  // depth <= K.
  n.grad = n.y + 3 + out * K + positions + K;
  // Merge: factor (W + s B A) with the factor m / ||.|| (n.scale + 1) and the product (1).
  n.merge = n.scale + 2;
  // Unmerge: W' / factor (1) - s B A (r + 2, 1): back to W within these of |W| + 2 s |B| |A|.
  n.unmerge = n.merge + 1 + r + 3;
  // bf16 autocast: the products on the path (base, lora_A, lora_B; B A for the norm) each round
  // their two operands and their result (4 x 3), six elementwise results (the bias off, scale - 1,
  // two products, two sums); the backward's products (dy through lora_B, then lora_A or the
  // weight: 2 x 3) and their elementwise products (3).
  n.y16 = 4 * 3 + 6;
  n.grad16 = n.y16 + 2 * 3 + 3;
  return n;
}

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

/// The geometry of the adapted layer and the scaling (the weights come from the files).
LoraLayer layer_shape(double scaling, bool conv) {
  LoraLayer l;
  l.scaling = scaling, l.conv = conv, l.stride = {1, 1}, l.padding = {1, 1};
  return l;
}

/// The layer as it is now in `model` (weights, factors) and its magnitude.
std::pair<LoraLayer, torch::Tensor> current(TensorModel& model, LoraLayer shape, const std::string& layer) {
  auto p = model.named_parameters();
  const std::string k = layer + ".lora_default.";
  shape.W = p[layer + ".weight"].detach().clone(), shape.b = p[layer + ".bias"].detach().clone();
  shape.A = p[k + "lora_A"].detach().clone(), shape.B = p[k + "lora_B"].detach().clone();
  return {shape, p[k + "lora_magnitude_vector"].detach().clone()};
}

template <class Net>
void check_against_peft(const std::string& name, Json config, const std::string& layer, LoraLayer shape) {
  Lora lora;
  auto model = std::make_shared<Net>();
  load_weights(*model, golden(name + "/base.safetensors"), name);
  auto expected = io::SafetensorsFile::open(golden(name + "/expected.safetensors"));
  const auto x = expected.load("x");
  const auto base_y = model->forward(x).detach();
  const auto d = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble); };

  auto adapter = lora.make(config);
  adapter->attach(*model);
  auto params = model->named_parameters();
  const std::string k = layer + ".lora_default.";
  // The magnitude starts at the base weight's norms per output channel, shaped as PEFT's: the
  // exact norm (double) within squares (1) summed (K), the root (1) and the cast (1): relative
  // gamma_{K+3}(2^-24), for refit's and PEFT's (the norm is its own P: a sum of squares).
  REQUIRE(params.contains(k + "lora_magnitude_vector"));
  CHECK(params[k + "lora_magnitude_vector"].sizes() == expected.load("init_magnitude").sizes());
  {
    const auto W = d(params[layer + ".weight"]);
    const auto norm = W.reshape({W.size(0), -1}).norm(2, {1}).reshape(expected.load("init_magnitude").sizes());
    check_both_within(name + " init magnitude", params[k + "lora_magnitude_vector"], expected.load("init_magnitude"), norm,
                      norm, W.numel() / W.size(0) + 3);
  }
  {
    // B = 0, m = ||W||: the base output (the scale is 1 within its depth; base_y and this y each
    // within their depth of the exact base output, relative to P = y_abs: twice the bound).
    auto [now, m] = current(*model, shape, layer);
    const Outcome abs = dora_exact(now, m, x, true);
    check_within(name + " y at init", model->forward(x), d(base_y), abs.y, dora_depth(now, x).y, 2);
  }
  adapter->import_files(*model, io::read_adapter_files(golden(name + "/peft")));

  // fp32: forward and every gradient (x, A, B, magnitude), refit's and PEFT's, each within
  // gamma~_n(2^-24) P(|inputs|) of the exact layer (double), n from dora_depth.
  auto [now, m] = current(*model, shape, layer);
  const Outcome exact = dora_exact(now, m, x, false), abs = dora_exact(now, m, x, true);
  const DoraDepth n = dora_depth(now, x);
  const Outcome fp32 = run(*model, layer, x, false);
  check_both_within(name + " y", fp32.y, expected.load("y"), exact.y, abs.y, n.y);
  check_both_within(name + " grad x", fp32.grad_x, expected.load("grad_x"), exact.grad_x, abs.grad_x, n.grad);
  check_both_within(name + " grad A", fp32.grad_A, expected.load("grad_A"), exact.grad_A, abs.grad_A, n.grad);
  check_both_within(name + " grad B", fp32.grad_B, expected.load("grad_B"), exact.grad_B, abs.grad_B, n.grad);
  check_both_within(name + " grad m", fp32.grad_m, expected.load("grad_m"), exact.grad_m, abs.grad_m, n.grad);
  // The norm is detached: dropping it from the graph changes the factors' gradients (a DoRA
  // without the detach would fail the checks above; here: the gradients are not all zero).
  CHECK(fp32.grad_m.abs().sum().item<double>() > 0);

  // bf16 autocast: the same ops under autocast on both sides; refit's and PEFT's results each
  // within (gamma~_{n16}(2^-8) + gamma~_n(2^-24)) P(|inputs|) of the exact layer.
  const Outcome bf = run(*model, layer, x, true);
  auto bf16_bound = [&](std::int64_t n16, std::int64_t n32) {
    return (prob_gamma(n16, kUnitBf16) + prob_depth_bound(n32, torch::kFloat)) / prob_depth_bound(n32, torch::kFloat);
  };
  check_both_within(name + " bf16 y", bf.y, expected.load("y_bf16"), exact.y, abs.y, n.y, bf16_bound(n.y16, n.y));
  const double g16 = bf16_bound(n.grad16, n.grad);
  check_both_within(name + " bf16 grad x", bf.grad_x, expected.load("grad_x_bf16"), exact.grad_x, abs.grad_x, n.grad, g16);
  check_both_within(name + " bf16 grad A", bf.grad_A, expected.load("grad_A_bf16"), exact.grad_A, abs.grad_A, n.grad, g16);
  check_both_within(name + " bf16 grad B", bf.grad_B, expected.load("grad_B_bf16"), exact.grad_B, abs.grad_B, n.grad, g16);
  check_both_within(name + " bf16 grad m", bf.grad_m, expected.load("grad_m_bf16"), exact.grad_m, abs.grad_m, n.grad, g16);
  // Autocast did run in bf16 (on both sides): the mean distance from the exact output is above
  // an eighth of one bf16 rounding's (u/4 to u/2 relative on average); fp32's is 2^16 times less.
  const double one_rounding = kUnitBf16 / 8 * exact.y.abs().mean().item<double>();
  CHECK((bf.y.to(torch::kDouble) - exact.y).abs().mean().item<double>() > one_rounding);
  CHECK((expected.load("y_bf16").to(torch::kDouble) - exact.y).abs().mean().item<double>() > one_rounding);

  // Merge = PEFT's merge_and_unload weight; the output does not change; unmerge restores.
  torch::NoGradGuard ng;
  const auto weight_before = params[layer + ".weight"].clone();
  const std::int64_t out = now.W.size(0), r = now.rank();
  const auto BA = [&](const torch::Tensor& B, const torch::Tensor& A) {
    return at::mm(B.reshape({out, r}), A.reshape({r, -1})).reshape(now.W.sizes());
  };
  const auto V = d(now.W) + now.scaling * BA(d(now.B), d(now.A));
  const auto V_abs = d(now.W).abs() + now.scaling * BA(d(now.B).abs(), d(now.A).abs());
  const auto row = [&](const torch::Tensor& t) { return now.conv ? t.reshape({-1, 1, 1, 1}) : t.reshape({-1, 1}); };
  const auto factor = row(d(m).reshape({-1}) / V.reshape({out, -1}).norm(2, {1}));
  adapter->merge(*model);
  check_both_within(name + " merged weight", params[layer + ".weight"], expected.load("merged_weight"), factor * V,
                    factor.abs() * V_abs, n.merge + r + 3);
  // The merged layer: conv(x, fl(W')) + b, relative to conv(|x|, |W'|) + |b| <= y_abs, within the
  // product (K), the bias (1) and the merged weight's depth: <= n.y + n.merge + r + 3.
  check_both_within(name + " merged y", model->forward(x), expected.load("y"), exact.y, abs.y, n.y + n.merge + r + 3);
  adapter->unmerge(*model);
  check_within(name + " unmerged weight", params[layer + ".weight"], d(weight_before),
               d(now.W).abs() + 2 * now.scaling * BA(d(now.B).abs(), d(now.A).abs()), n.unmerge);
  // Unmerged: the weight moved by its unmerge bound; y as before within y's bound and that of the
  // weight's change (conv(|x|, .) of it, <= 2 y_abs): 3 gamma.
  check_within(name + " unmerged y", model->forward(x), exact.y, abs.y, n.y + n.unmerge, 3);
  adapter->set_active(*model, false);
  // Disabled: the base output, base_y and this each within (K + 1) of the exact base output, the
  // weight within its unmerge bound: relative to y_abs (>= the base's P), 3 gamma.
  check_within(name + " disabled y", model->forward(x), d(base_y), abs.y, n.y + n.unmerge, 3);
}

}  // namespace

TEST_CASE("DoRA on Linear: magnitude init, PEFT adapter loads, forward, every gradient, merge match PEFT (golden)") {
  check_against_peft<LinearNet>("linear", Json{{"r", 4}, {"alpha", 8}, {"use_dora", true}, {"target_modules", {"proj"}}},
                                "proj", layer_shape(8.0 / 4, false));
}

TEST_CASE(
    "DoRA on Conv2d (rsLoRA): magnitude init, PEFT adapter loads, forward, every gradient, merge match PEFT (golden)") {
  check_against_peft<ConvNet>(
      "conv", Json{{"r", 2}, {"alpha", 4}, {"use_rslora", true}, {"use_dora", true}, {"target_modules", {"conv"}}}, "conv",
      layer_shape(4 / std::sqrt(2.0), true));
}

namespace {

/// refit's DoRA adapter with set factors and magnitude; the file it writes is what PEFT loaded
/// (every tensor) and gave refit's outputs for, before and after merging.
template <class Net>
void check_refit_written(const std::string& name, Json config, const std::string& layer, LoraLayer shape) {
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
  // refit's and PEFT's outputs, before and after merging, each within the fp32 bound of the
  // exact layer (double, from these factors; dora_depth, the merged path as in check_against_peft).
  {
    auto [now, m] = current(*model, shape, layer);
    torch::AutoGradMode grad(true);
    const Outcome exact = dora_exact(now, m, x, false), abs = dora_exact(now, m, x, true);
    const DoraDepth n = dora_depth(now, x);
    check_both_within(name + " refit-written y", y, peft.load("y"), exact.y, abs.y, n.y);
    check_both_within(name + " refit-written merged y", merged_y, peft.load("merged_y"), exact.y, abs.y,
                      n.y + n.merge + now.rank() + 3);
  }
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
                                 "proj", layer_shape(8.0 / 4, false));
  check_refit_written<ConvNet>(
      "conv", Json{{"r", 2}, {"alpha", 4}, {"use_rslora", true}, {"use_dora", true}, {"target_modules", {"conv"}}}, "conv",
      layer_shape(4 / std::sqrt(2.0), true));
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
  CHECK_THROWS_WITH(dora->import_files(*model, files), Catch::Contains("no base_model.model.proj.lora_magnitude_vector"));
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
  model->eval();                // no dropout: the same formula on x itself
  CHECK(max_abs(model->forward(x),
                at::linear(x, W, b) + (scale - 1) * at::linear(x, W) + scale * at::linear(at::linear(x, A), B) * s) <= 1e-5);
}

}  // namespace refit_test_dora
