// bf16 products through fp32 kernels (precision/bf16_products.h): each routed product equals the
// fp32 kernel on the widened operands rounded once to bf16, bit for bit; the products a frozen
// bf16 model runs (autocast's linear, matmul, conv2d, scaled_dot_product_attention, and their
// backward) reach the route, so an upgrade of LibTorch that moves them elsewhere fails here;
// other dtypes pass through unchanged; routed and native products obey the same derived bound.
#include <ATen/ATen.h>
#include <c10/core/DispatchKey.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/types.h>

#include <cmath>
#include <string>

#include "precision/autocast_guard.h"
#include "precision/bf16_products.h"
#include "test_support.h"

using namespace refit;
using precision::bf16_routed_calls;
using precision::Bf16Route;

namespace {
torch::Tensor bf16_randn(std::vector<int64_t> shape, std::uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g, torch::kFloat).to(torch::kBFloat16);
}
// The arithmetic of a bf16 kernel, spelled out: widen, the fp32 kernel, round once.
torch::Tensor f(const torch::Tensor& t) { return t.to(torch::kFloat); }
torch::Tensor b(const torch::Tensor& t) { return t.to(torch::kBFloat16); }
bool same_bits(const torch::Tensor& x, const torch::Tensor& y) {
  return x.scalar_type() == y.scalar_type() && x.sizes() == y.sizes() && torch::equal(x, y);
}
}  // namespace

TEST_CASE("bf16 route: every routed operator exists in this LibTorch") {
  for (auto op = precision::bf16_routed_operators(); *op; ++op) {
    std::string name = *op + 6;  // after "aten::"
    const auto dot = name.find('.');
    const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    name = "aten::" + name.substr(0, dot);
    INFO(*op);
    CHECK(c10::Dispatcher::singleton().findSchema({name, overload}).has_value());
  }
}

TEST_CASE("bf16 route: each product equals the fp32 kernel on the widened operands, rounded once") {
  Bf16Route route;
  const auto a = bf16_randn({37, 53}, 1), m = bf16_randn({53, 29}, 2), bias = bf16_randn({37, 29}, 3);
  const auto calls = bf16_routed_calls();
  CHECK(same_bits(at::mm(a, m), b(at::mm(f(a), f(m)))));
  CHECK(same_bits(at::addmm(bias, a, m, 0.5, 2.0), b(at::addmm(f(bias), f(a), f(m), 0.5, 2.0))));
  auto out = at::empty({0}, torch::kBFloat16);
  at::mm_out(out, a, m);
  CHECK(same_bits(out, b(at::mm(f(a), f(m)))));
  auto inplace = bias.clone();
  inplace.addmm_(a, m);
  CHECK(same_bits(inplace, b(at::addmm(f(bias), f(a), f(m)))));
  const auto x = bf16_randn({3, 17, 40}, 4), y = bf16_randn({3, 40, 9}, 5), c = bf16_randn({3, 17, 9}, 6);
  CHECK(same_bits(at::bmm(x, y), b(at::bmm(f(x), f(y)))));
  CHECK(same_bits(at::baddbmm(c, x, y, 1.0, 0.25), b(at::baddbmm(f(c), f(x), f(y), 1.0, 0.25))));
  CHECK(bf16_routed_calls() - calls == 6);
}

TEST_CASE("bf16 route: conv2d and its backward equal fp32 convolution on widened operands, rounded once") {
  Bf16Route route;
  const auto x = bf16_randn({2, 3, 11, 13}, 7).requires_grad_(), w = bf16_randn({5, 3, 3, 3}, 8).requires_grad_();
  const auto bias = bf16_randn({5}, 9).requires_grad_();
  const auto g = bf16_randn({2, 5, 6, 7}, 10);
  const auto calls = bf16_routed_calls();
  auto yb = at::conv2d(x, w, bias, {2, 2}, {1, 1}, {1, 1});
  CHECK(bf16_routed_calls() - calls == 1);
  yb.backward(g);
  CHECK(bf16_routed_calls() - calls == 2);
  // The same in fp32 on the widened leaves: forward, then convolution's backward on widened g.
  auto xf = f(x.detach()).requires_grad_(), wf = f(w.detach()).requires_grad_(), bf = f(bias.detach()).requires_grad_();
  auto yf = at::conv2d(xf, wf, bf, {2, 2}, {1, 1}, {1, 1});
  CHECK(same_bits(yb, b(yf)));
  yf.backward(f(g));
  CHECK(same_bits(x.grad(), b(xf.grad())));
  CHECK(same_bits(w.grad(), b(wf.grad())));
  CHECK(same_bits(bias.grad(), b(bf.grad())));
}

TEST_CASE("bf16 route: CPU flash attention forward and backward equal the fp32 kernel on widened operands") {
  Bf16Route route;
  const auto q = bf16_randn({2, 3, 10, 8}, 11), k = bf16_randn({2, 3, 12, 8}, 12), v = bf16_randn({2, 3, 12, 8}, 13);
  const auto g = bf16_randn({2, 3, 10, 8}, 14);
  const auto calls = bf16_routed_calls();
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v);
  auto [out32, lse32] = at::_scaled_dot_product_flash_attention_for_cpu(f(q), f(k), f(v));
  CHECK(same_bits(out, b(out32)));
  CHECK(same_bits(lse, lse32));
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0, false);
  auto [gq32, gk32, gv32] =
      at::_scaled_dot_product_flash_attention_for_cpu_backward(f(g), f(q), f(k), f(v), f(out), lse, 0.0, false);
  CHECK(same_bits(gq, b(gq32)));
  CHECK(same_bits(gk, b(gk32)));
  CHECK(same_bits(gv, b(gv32)));
  CHECK(bf16_routed_calls() - calls == 2);
}

// Which operators a frozen bf16 model's products reach is LibTorch's choice: if an upgrade
// moves one (a new fused kernel), the count here changes and this test names it.
TEST_CASE("bf16 route: autocast's linear, matmul, conv2d and attention reach it, forward and backward") {
  Bf16Route route;
  const auto w = bf16_randn({24, 16}, 15);  // a frozen bf16 weight
  auto x = torch::randn({2, 5, 16}).requires_grad_();
  auto img = torch::randn({2, 3, 8, 8}).requires_grad_();
  const auto kernel = bf16_randn({4, 3, 2, 2}, 16);
  auto q = torch::randn({2, 2, 6, 8}).requires_grad_();
  AutocastGuard autocast(c10::DeviceType::CPU, c10::kBFloat16, true);
  auto routed = [&](auto&& fn) {
    const auto before = bf16_routed_calls();
    fn();
    return bf16_routed_calls() - before;
  };
  torch::Tensor y;
  CHECK(routed([&] { y = at::linear(x, w); }) == 1);
  CHECK(y.scalar_type() == torch::kBFloat16);
  CHECK(routed([&] { y.sum().backward(); }) == 1);  // d input (the frozen weight takes none)
  torch::Tensor s;
  CHECK(routed([&] { s = at::matmul(q, q.transpose(-2, -1)); }) == 1);
  CHECK(routed([&] { s.sum().backward(); }) == 2);
  torch::Tensor c;
  CHECK(routed([&] { c = at::conv2d(img, kernel, {}, {2, 2}); }) == 1);
  CHECK(routed([&] { c.sum().backward(); }) == 1);
  torch::Tensor o;
  CHECK(routed([&] { o = at::scaled_dot_product_attention(q, q, q); }) == 1);
  CHECK(o.scalar_type() == torch::kBFloat16);
  CHECK(routed([&] { o.sum().backward(); }) == 1);
}

TEST_CASE("bf16 route: products not all in bf16 reach LibTorch's kernels unchanged") {
  const auto a = torch::randn({31, 47}), m = torch::randn({47, 19});
  const auto native = at::mm(a, m);
  const auto conv_native = at::conv2d(a.view({1, 1, 31, 47}), m.narrow(0, 0, 9).view({19, 1, 3, 3}));
  Bf16Route route;
  const auto calls = bf16_routed_calls();
  CHECK(same_bits(at::mm(a, m), native));
  CHECK(same_bits(at::conv2d(a.view({1, 1, 31, 47}), m.narrow(0, 0, 9).view({19, 1, 3, 3})), conv_native));
  CHECK_THROWS(at::mm(a.to(torch::kBFloat16), m));  // mixed dtypes stay an error, as without the route
  CHECK(bf16_routed_calls() == calls);
}

// The bound both paths obey, from the arithmetic: the fp32 sum s of K exact products has
// |s - ref| <= gamma_K (|A||B|), gamma_K = K u32 / (1 - K u32), u32 = 2^-24, in any order; the
// result is s rounded once to bf16, |y - s| <= u16 |s|, u16 = 2^-8. So
// |y - ref| <= u16 |ref| + (1 + u16) gamma_K (|A||B|). Subnormal inputs (flushed by AVX512-BF16)
// do not occur in these operands (|x| >= 2^-20 with probability ~1; the bound has 2^-100 slack).
TEST_CASE("bf16 products, routed or native, are within the fp32-accumulation bound of the exact product") {
  const int64_t K = 1024;
  const auto a = bf16_randn({64, K}, 17), m = bf16_randn({K, 48}, 18);
  const auto ref = at::mm(a.to(torch::kDouble), m.to(torch::kDouble));
  const auto abs_prod = at::mm(a.to(torch::kDouble).abs(), m.to(torch::kDouble).abs());
  const double u16 = std::ldexp(1.0, -8), u32 = std::ldexp(1.0, -24);
  const double gamma = K * u32 / (1 - K * u32);
  const auto bound = ref.abs() * u16 + abs_prod * ((1 + u16) * gamma) + std::ldexp(1.0, -100);
  auto within = [&](const torch::Tensor& y) { return (y.to(torch::kDouble) - ref).abs().le(bound).all().item<bool>(); };
  CHECK(within(at::mm(a, m)));  // whichever path this process configured
  Bf16Route route;
  CHECK(within(at::mm(a, m)));
}
