#pragma once
// What the LoRA, DoRA and several-adapter tests share: the small adaptable models their golden
// data was generated for (tests/golden/make_lora_peft.py, make_dora_peft.py,
// make_lora_combine.py) and the "lora" factory from the real plugin.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/plugin_loader.h"
#include "adaptable_nets.h"
#include "numeric_bounds.h"
#include "test_support.h"

namespace refit::lora_test {

using namespace ::refit::test;  // numeric_bounds.h

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

/// One LoRA layer as PEFT computes it (lora.layer.Linear / Conv2d forward):
///   y = base(x; W, b) + lora_B(lora_A(x)) * scaling,
/// lora_A with the base layer's kernel, stride and padding but no dilation, lora_B 1x1.
struct LoraLayer {
  torch::Tensor W, b, A, B;
  double scaling = 1;
  bool conv = false;
  std::vector<std::int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& W_, const torch::Tensor& b_, const torch::Tensor& A_,
                        const torch::Tensor& B_) const {
    if (!conv) return at::linear(x, W_, b_) + at::linear(at::linear(x, A_), B_) * scaling;
    return at::conv2d(x, W_, b_, stride, padding, dilation) +
           at::conv2d(at::conv2d(x, A_, {}, stride, padding), B_) * scaling;
  }
  /// K of one output element's dot product through W (and through A: the same kernel).
  std::int64_t k_base() const { return W.numel() / W.size(0); }
  std::int64_t rank() const { return A.size(0); }
};

/// The exact value (in double) of a LoRA layer's output y and of the gradients of sum(y^2) with
/// respect to A and B, each with P(|inputs|) (the same computation on absolute values, see
/// numeric_bounds.h) and its depth n in roundings.
struct LoraReference {
  torch::Tensor y, y_abs, grad_A, grad_A_abs, grad_B, grad_B_abs;
  std::int64_t n_y = 0, n_grad_A = 0, n_grad_B = 0;
  /// y's bound path by path: the base branch's P (|x| |W| + |b|) with its depth, the LoRA
  /// branch's (s |x| |A| |B|) with its own. Each branch's roundings scale only its own terms, so
  /// the sum of the two bounds holds where the single depth n_y over all of y_abs is up to
  /// sqrt(n_y / (K + 2)) (about sqrt 2) as loose (numeric_bounds.h: sqrt(a + b) <= sqrt(a) + sqrt(b)
  /// for the two sums of squares).
  torch::Tensor y_abs_base, y_abs_lora;
  std::int64_t n_y_base = 0, n_y_lora = 0;
  torch::Tensor y_bound() const {
    return prob_depth_bound(n_y_base, torch::kFloat) * y_abs_base + prob_depth_bound(n_y_lora, torch::kFloat) * y_abs_lora;
  }
};

inline LoraReference lora_reference(const LoraLayer& l, const torch::Tensor& x) {
  LoraReference r;
  auto run = [&](bool absolute, torch::Tensor& y, torch::Tensor& gA, torch::Tensor& gB) {
    auto d = [&](const torch::Tensor& t) {
      auto v = t.detach().to(torch::kDouble);
      return absolute ? v.abs() : v;
    };
    auto A = d(l.A).requires_grad_(true), B = d(l.B).requires_grad_(true);
    y = l.forward(d(x), d(l.W), l.b.defined() ? d(l.b) : torch::Tensor(), A, B);
    (y * y).sum().backward();
    y = y.detach(), gA = A.grad(), gB = B.grad();
  };
  run(false, r.y, r.grad_A, r.grad_B);
  run(true, r.y_abs, r.grad_A_abs, r.grad_B_abs);
  // y: the base dot product (K), its bias (1); lora_A's dot product (K), lora_B's (r), the scaling
  // rounded to fp32 and the multiply (2), the sum of the two branches (1).
  r.n_y = 2 * l.k_base() + l.rank() + 4;
  // Path by path: the base branch is its dot product (K), the bias (1) and the final sum (1); the
  // LoRA branch lora_A's (K), lora_B's (r), the scaling and the multiply (2) and the final sum (1).
  {
    const auto ax = x.detach().to(torch::kDouble).abs(), aW = l.W.detach().to(torch::kDouble).abs();
    const auto ab = l.b.defined() ? l.b.detach().to(torch::kDouble).abs() : torch::Tensor();
    r.y_abs_base = l.conv ? at::conv2d(ax, aW, ab, l.stride, l.padding, l.dilation) : at::linear(ax, aW, ab);
    r.y_abs_lora = r.y_abs - r.y_abs_base;
  }
  r.n_y_base = l.k_base() + 2;
  r.n_y_lora = l.k_base() + l.rank() + 3;
  // The gradients: dL/dy = 2y (exact: a power of two), times the scaling (2 roundings), then
  // grad_B sums over the positions (P terms) products with lora_A(x) (depth K); grad_A first
  // sums over the output channels (B^T dy) then over the positions.
  const std::int64_t positions = r.y.numel() / r.y.size(l.conv ? 1 : -1), out_channels = l.W.size(0);
  r.n_grad_B = r.n_y + 2 + positions + l.k_base();
  r.n_grad_A = r.n_y + 2 + out_channels + positions;
  return r;
}

/// refit's result and the Python reference's are each within gamma~_n(fp32) * P(|inputs|)
/// (the probabilistic bound, numeric_bounds.h)
/// (+ the double reference's own error) of the exact value: checked for both, so a bound that
/// only held for this CPU's kernels would fail on the fixture (computed elsewhere).
inline void check_both_within(const std::string& what, const torch::Tensor& refit, const torch::Tensor& reference,
                              const torch::Tensor& exact, const torch::Tensor& abs, std::int64_t n, double factor = 1) {
  const auto bound = factor * prob_depth_bound(n, torch::kFloat) * abs;
  const double ours = bound_ratio(refit, exact, bound), theirs = bound_ratio(reference, exact, bound);
  std::printf("%s: |refit - exact| / bound %.3f, |python - exact| / bound %.3f (n = %lld, max bound %.2e)\n", what.c_str(),
              ours, theirs, static_cast<long long>(n), bound.max().item<double>());
  INFO("n " << n);
  check_bound_ratio(what + ": refit", ours);
  check_bound_ratio(what + ": python", theirs);
}

/// As above, with the bound given elementwise (LoraReference::y_bound).
inline void check_both_within_bound(const std::string& what, const torch::Tensor& refit, const torch::Tensor& reference,
                                    const torch::Tensor& exact, const torch::Tensor& bound) {
  const double ours = bound_ratio(refit, exact, bound), theirs = bound_ratio(reference, exact, bound);
  std::printf("%s: |refit - exact| / bound %.3f, |python - exact| / bound %.3f (max bound %.2e)\n", what.c_str(), ours,
              theirs, bound.max().item<double>());
  check_bound_ratio(what + ": refit", ours);
  check_bound_ratio(what + ": python", theirs);
}

/// Only refit's result (no Python value to compare): within the bound of the exact value.
inline void check_within(const std::string& what, const torch::Tensor& refit, const torch::Tensor& exact,
                         const torch::Tensor& abs, std::int64_t n, double factor = 1) {
  const auto bound = factor * prob_depth_bound(n, torch::kFloat) * abs;
  const double ours = bound_ratio(refit, exact, bound);
  INFO("n " << n);
  check_bound_ratio(what + ": refit", ours);
}

}  // namespace refit::lora_test
