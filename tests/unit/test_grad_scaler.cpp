// GradScaler against Python's torch.amp.GradScaler (tests/golden/make_grad_scaler.py): the same
// scales, growth-tracker values, skipped steps and unscaled gradients, step by step.
// Also fused AdamW taking found_inf from the scaler (tests/golden/make_fused_adamw_skip.py).
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "precision/grad_scaler.h"
#include "train/optimizer.h"
#include "numeric_bounds.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_grad_scaler {

using namespace refit;
using namespace refit::test;

namespace {
float decode(const nlohmann::json& v) {
  if (v.is_number()) return v.get<float>();
  std::string s = v.get<std::string>();
  if (s == "nan") return NAN;
  return s == "-inf" ? -INFINITY : INFINITY;
}

torch::Tensor tensor_of(const nlohmann::json& values, const nlohmann::json& shape) {
  std::vector<float> v;
  for (const auto& x : values) v.push_back(decode(x));
  return torch::tensor(v, torch::kFloat).reshape(shape.get<std::vector<std::int64_t>>());
}
}  // namespace

TEST_CASE("GradScaler matches torch.amp.GradScaler step by step (golden)") {
  std::ifstream in(test::source_dir() + "/tests/golden/grad_scaler.json");
  REQUIRE(in);
  auto golden = nlohmann::json::parse(in);
  GradScalerOptions o;
  o.init_scale = golden["options"]["init_scale"];
  o.growth_factor = golden["options"]["growth_factor"];
  o.backoff_factor = golden["options"]["backoff_factor"];
  o.growth_interval = golden["options"]["growth_interval"];
  GradScaler scaler(o, torch::kCPU);
  int skipped = 0;
  for (std::size_t i = 0; i < golden["steps"].size(); ++i) {
    const auto& s = golden["steps"][i];
    INFO("step " << i);
    const double scale = scaler.scale_tensor().item<double>();
    CHECK(scale == s["scale"].get<double>());
    std::vector<torch::Tensor> grads;
    for (std::size_t p = 0; p < s["grads"].size(); ++p)
      grads.push_back(tensor_of(s["grads"][p], s["shapes"][p]) * scaler.scale_tensor());  // backward of the scaled loss
    scaler.unscale(grads);
    CHECK(scaler.found_inf().item<double>() == s["found_inf"].get<double>());
    // Exact, no tolerance: the scales are powers of two, so scaling and unscaling (a multiply by
    // the reciprocal, also a power of two) round nothing unless a value overflows to inf.
    for (std::size_t p = 0; p < grads.size(); ++p) {
      auto expected = tensor_of(s["unscaled"][p], s["shapes"][p]);
      CHECK(torch::allclose(grads[p], expected, 0, 0, /*equal_nan=*/true));
    }
    const bool stepped = scaler.found_inf().item<double>() == 0;
    CHECK(stepped == s["stepped"].get<bool>());
    skipped += !stepped;
    scaler.update();
    CHECK(scaler.scale_tensor().item<double>() == s["scale_after"].get<double>());
    CHECK(scaler.growth_tracker().item<int>() == s["growth_tracker_after"].get<int>());
  }
  CHECK(skipped == 4);
}

TEST_CASE("a disabled scaler leaves gradients alone, found_inf comes from the caller's norm check") {
  GradScalerOptions o;
  o.enabled = false;
  GradScaler scaler(o, torch::kCPU);
  std::vector<torch::Tensor> grads{torch::ones({3}), torch::tensor({1.f, NAN})};
  scaler.unscale(grads);
  CHECK(torch::equal(grads[0], torch::ones({3})));  // not scaled
  CHECK(scaler.found_inf().item<float>() == 0.0f);
  scaler.record_found_inf(torch::tensor(true));
  CHECK(scaler.found_inf().item<float>() == 1.0f);
  scaler.update();
  CHECK(scaler.scale_tensor().item<float>() == 1.0f);
}

TEST_CASE("fused AdamW takes found_inf from the scaler and skips like torch.amp with fused=True (golden)") {
  auto g = io::SafetensorsFile::open(test::source_dir() + "/tests/golden/fused_adamw_skip.safetensors");
  auto p0 = g.load("param0_initial").clone().requires_grad_(true);
  auto p1 = g.load("param1_initial").clone().requires_grad_(true);
  OptimizerSpec spec;  // adamw, fused
  spec.lr = 1e-2;
  ParameterGroup group{"g", {p0, p1}, 1e-2, 0.05, 1e-8, {0.9, 0.999}};
  Optimizer opt(spec, {group});
  REQUIRE(opt.skips_on_device());
  GradScalerOptions o;
  o.init_scale = 1024.0;
  o.growth_interval = 2;
  GradScaler scaler(o, torch::kCPU);
  // The exact AdamW (double) on the same gradients, skipping where they are not finite, and per
  // element the bound of an fp32 run (numeric_bounds.h): a step at count t rounds the decay
  // (2), m (an abs-sum of t terms, 3 per step: 3t), v (3t + 1), the bias corrections, root,
  // division, products and the update (10); first-order, relative to
  // |p| + 2 lr / bc1 * m_abs / denom (m's error is relative to m_abs = the same sum of |g|, the
  // denominator's relative error moves m / denom by its own size). Steps add their errors (the
  // decay factor 1 - lr wd < 1 does not grow earlier ones).
  torch::Tensor exact_p[2], exact_bound[2];
  const double lr = 1e-2, wd = 0.05, eps = 1e-8, b1 = 0.9, b2 = 0.999;
  std::vector<torch::Tensor> p_exact{g.load("param0_initial").to(torch::kDouble),
                                     g.load("param1_initial").to(torch::kDouble)};
  std::vector<torch::Tensor> m(2), m_abs(2), v(2), bound(2);
  for (int j = 0; j < 2; ++j)
    m[j] = torch::zeros_like(p_exact[j]), m_abs[j] = m[j].clone(), v[j] = m[j].clone(), bound[j] = m[j].clone();
  std::int64_t t = 0;
  for (int i = 0; i < 10; ++i) {
    INFO("step " << i);
    const std::string k = "step" + std::to_string(i) + "_";
    std::vector<torch::Tensor> gd{g.load(k + "grad0").to(torch::kDouble), g.load(k + "grad1").to(torch::kDouble)};
    if (torch::isfinite(gd[0]).all().item<bool>() && torch::isfinite(gd[1]).all().item<bool>()) {
      ++t;
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      const double rel = gamma_n(6 * t + 10, kUnitFp32);
      for (int j = 0; j < 2; ++j) {
        p_exact[j] = p_exact[j] * (1 - lr * wd);
        m[j] = b1 * m[j] + (1 - b1) * gd[j], m_abs[j] = b1 * m_abs[j] + (1 - b1) * gd[j].abs();
        v[j] = b2 * v[j] + (1 - b2) * gd[j] * gd[j];
        const auto denom = v[j].sqrt() / std::sqrt(bc2) + eps;
        p_exact[j] = p_exact[j] - lr / bc1 * m[j] / denom;
        bound[j] = bound[j] + rel * (p_exact[j].abs() + 2 * lr / bc1 * m_abs[j] / denom);
      }
    }
    exact_p[0] = p_exact[0], exact_p[1] = p_exact[1], exact_bound[0] = bound[0], exact_bound[1] = bound[1];
    CHECK(scaler.scale_tensor().item<double>() == g.load(k + "scale").item<double>());
    p0.mutable_grad() = g.load(k + "grad0") * scaler.scale_tensor();
    p1.mutable_grad() = g.load(k + "grad1") * scaler.scale_tensor();
    scaler.unscale({p0.grad(), p1.grad()});
    opt.step(scaler.found_inf());  // no host read: the kernel decides
    scaler.update();
    opt.zero_grad();
    for (int j = 0; j < 2; ++j) {
      const auto ours = j == 0 ? p0 : p1, theirs = g.load(k + "param" + std::to_string(j));
      const double r_ours = bound_ratio(ours.detach(), exact_p[j], exact_bound[j]);
      const double r_theirs = bound_ratio(theirs, exact_p[j], exact_bound[j]);
      check_bound_ratio("parameters: refit", r_ours);
      check_bound_ratio("parameters: torch", r_theirs);
    }
    CHECK(opt.state_dict().at("group0.param0.step").item<double>() == g.load(k + "count").item<double>());
  }
}

}  // namespace refit_test_grad_scaler
