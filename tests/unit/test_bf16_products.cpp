// bf16 products through fp32 kernels (precision/bf16_products.h): each routed product equals the
// fp32 kernel on the widened operands rounded once to bf16, bit for bit; the products a frozen
// bf16 model runs (autocast's linear, matmul, conv2d, scaled_dot_product_attention, and their
// backward) reach the route, so an upgrade of LibTorch that moves them elsewhere fails here;
// other dtypes pass through unchanged; routed and native products obey the same derived bound.
#include <ATen/ATen.h>
#include <c10/core/DispatchKey.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "precision/autocast_guard.h"
#include "io/remove_tree.h"
#include "precision/bf16_products.h"
#include "scripted_clock.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_bf16_products {

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

// ---- the choice per shape class (precision/shape_routing.h) ---------------------------------

using refit::test::ScriptedClock;

TEST_CASE("bf16 route by shape: shape classes round sizes up to powers of two") {
  CHECK(precision::shape_class("mm", {{37, 50}, {50, 200}}) == "mm 64x64 64x256");
  CHECK(precision::shape_class("mm", {{33, 64}, {64, 1}}) == "mm 64x64 64x1");
  CHECK(precision::shape_class("bmm", {{8, 10, 32}, {8, 32, 10}}) ==
        precision::shape_class("bmm", {{8, 16, 32}, {8, 32, 9}}));
  CHECK(precision::shape_class("mm", {{16, 16}, {16, 16}}) != precision::shape_class("bmm", {{16, 16}, {16, 16}}));
  // Layouts: a transposed view and a strided operand are classes of their own.
  CHECK(precision::shape_class("mm", {{8, 4096}, {4096, 128}}, "tc") == "mm 8x4096t 4096x128");
  CHECK(precision::shape_class("mm", {{8, 4096}, {4096, 128}}, "cs") == "mm 8x4096 4096x128s");
  CHECK(precision::shape_class("mm", {{8, 4096}, {4096, 128}}, "cc") ==
        precision::shape_class("mm", {{8, 4096}, {4096, 128}}));
}

static precision::ShapeRoutingOptions scripted(ScriptedClock& clock, int warmups, int reps) {
  precision::ShapeRoutingOptions o;
  o.warmups = warmups;
  o.reps = reps;
  o.clock = [&clock] { return clock.read(); };
  return o;
}

TEST_CASE("bf16 route by shape: the first call of a class times both kernels, later calls run the faster only") {
  ScriptedClock clock;
  precision::ShapeRouting routing(scripted(clock, /*warmups=*/1, /*reps=*/2));
  int native_runs = 0, fp32_runs = 0;
  const auto native = [&] { ++native_runs; };
  const auto fp32 = [&] { ++fp32_runs; };
  // The fp32 route's two timed runs (4, 3.5), native's timed warm-up (6: not 16x slower), its two
  // timed runs (5, 3): the fastest of each decides -> native.
  clock.durations = {4, 3.5, 6, 5, 3};
  CHECK_FALSE(routing.route_fp32("mm 64x64 64x64", native, fp32));
  CHECK(native_runs == 3);  // one warm-up, two timed
  CHECK(fp32_runs == 3);
  for (int i = 0; i < 5; ++i) CHECK_FALSE(routing.route_fp32("mm 64x64 64x64", native, fp32));
  CHECK(native_runs == 3);  // decided: nothing more is timed (the script is spent: a reading would fail)
  // Another class, where fp32 wins by a little.
  clock.durations.insert(clock.durations.end(), {1, 1.5, 2, 2, 2});
  CHECK(routing.route_fp32("mm 8x8 8x8", native, fp32));
  CHECK(routing.route_fp32("mm 8x8 8x8", native, fp32));
  // A native kernel whose warm-up alone is over 16x the fp32 route's fastest (a scalar fallback)
  // is not timed further.
  native_runs = 0;
  clock.durations.insert(clock.durations.end(), {0.01, 0.01, 0.5});
  CHECK(routing.route_fp32("mm 1024x1024 1024x1024", native, fp32));
  CHECK(native_runs == 1);
  const auto table = routing.decisions();
  REQUIRE(table.size() == 3);
  CHECK(table[0].shape_class == "mm 1024x1024 1024x1024");
  CHECK(table[0].native_given_up);
  CHECK(table[0].native_seconds == Approx(0.5));
  CHECK(table[1].shape_class == "mm 64x64 64x64");
  CHECK_FALSE(table[1].fp32);
  CHECK(table[1].native_seconds == 3);
  CHECK(table[1].fp32_seconds == 3.5);
  CHECK(table[1].calls == 6);
  CHECK(table[2].fp32);
  CHECK_FALSE(table[2].native_given_up);
  CHECK(table[2].calls == 2);
}

TEST_CASE("bf16 route by shape: each product runs the kernel its class chose, bit for bit that kernel's") {
  ScriptedClock clock;
  precision::ShapeRouting routing(scripted(clock, 0, 1));
  const auto a = bf16_randn({37, 53}, 1), m = bf16_randn({53, 29}, 2);
  const auto big = bf16_randn({100, 53}, 3);
  at::Tensor native_small, native_big;
  {
    // LibTorch's own bf16 kernel, whatever this process's route: a policy that times fp32 slower.
    ScriptedClock slow_fp32;
    slow_fp32.durations = {2, 1, 2, 1};  // each class: fp32 2, native 1
    precision::ShapeRouting always_native(scripted(slow_fp32, 0, 1));
    Bf16Route native_route(&always_native);
    const auto calls = bf16_routed_calls();
    native_small = at::mm(a, m);
    native_big = at::mm(big, m);
    CHECK(bf16_routed_calls() == calls);
  }
  Bf16Route route(&routing);
  clock.durations = {2, 1};  // [37, 53] x [53, 29]: fp32 2, native 1 -> native
  const auto calls = bf16_routed_calls();
  CHECK(same_bits(at::mm(a, m), native_small));
  CHECK(bf16_routed_calls() == calls);
  clock.durations.insert(clock.durations.end(), {1, 2});  // [100, 53] x [53, 29]: fp32
  CHECK(same_bits(at::mm(big, m), b(at::mm(f(big), f(m)))));
  CHECK(bf16_routed_calls() == calls + 1);
  // The same classes again: no timing (the script is spent), the same kernels.
  CHECK(same_bits(at::mm(a, m), native_small));
  CHECK(same_bits(at::mm(big, m), b(at::mm(f(big), f(m)))));
  // Autocast's linear reaches the policy through addmm, with its own class.
  clock.durations.insert(clock.durations.end(), {2, 1});
  {
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
    const auto y = at::linear(f(a), f(m).t().contiguous(), f(bf16_randn({29}, 7)));
    CHECK(y.scalar_type() == torch::kBFloat16);
  }
  CHECK(routing.decisions().size() == 3);
  // A transposed operand is a class of its own, timed on its first call.
  clock.durations.insert(clock.durations.end(), {2, 1});
  (void)at::mm(m.t(), a.t());
  const auto table = routing.decisions();
  REQUIRE(table.size() == 4);
  CHECK(std::any_of(table.begin(), table.end(), [](const auto& d) { return d.shape_class == "mm 32x64t 64x64t"; }));
  // An install without a policy inside routes everything through fp32, and puts the policy back.
  {
    Bf16Route all_fp32;
    CHECK(same_bits(at::mm(a, m), b(at::mm(f(a), f(m)))));
  }
  CHECK(same_bits(at::mm(a, m), native_small));
}

TEST_CASE("bf16 route by shape: a store file gives every later process the first one's decisions") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "refit-tests" / "shape-store";
  io::remove_tree(dir);  // (std::filesystem::remove_all may resolve to libtorch.so's copy: io/remove_tree.h)
  fs::create_directories(dir);
  const std::string store = (dir / "decisions.json").string();
  const auto nothing = [] {};
  {
    ScriptedClock clock;
    auto o = scripted(clock, 0, 1);
    o.store = store;
    precision::ShapeRouting first(o);
    clock.durations = {1, 2};  // fp32 1, native 2
    CHECK(first.route_fp32("mm 64x64 64x64", nothing, nothing));
    clock.durations.insert(clock.durations.end(), {2, 1});
    CHECK_FALSE(first.route_fp32("mm 8x8 8x8", nothing, nothing));
  }
  {
    // A later process: nothing is timed (its clock has no script: a reading fails), the
    // decisions are the first one's; a new class is timed and added.
    ScriptedClock clock;
    auto o = scripted(clock, 0, 1);
    o.store = store;
    precision::ShapeRouting later(o);
    CHECK(later.route_fp32("mm 64x64 64x64", nothing, nothing));
    CHECK_FALSE(later.route_fp32("mm 8x8 8x8", nothing, nothing));
    clock.durations = {3, 1};
    CHECK_FALSE(later.route_fp32("bmm 4x4x4 4x4x4", nothing, nothing));
    const auto table = later.decisions();
    REQUIRE(table.size() == 3);
    CHECK_FALSE(table[0].from_store);  // bmm: timed here
    CHECK(table[1].from_store);        // mm 64x64 64x64: the first process's timings
    CHECK(table[1].fp32_seconds == 1);
    CHECK(table[1].native_seconds == 2);
  }
  CHECK(precision::read_shape_store(store).size() == 3);
  // A product timed while its class is decided dispatches products of its own (a convolution's):
  // the nested decision takes no second file lock (it would wait forever) and both are kept.
  {
    double ticks = 0;
    precision::ShapeRoutingOptions o;
    o.warmups = 0;
    o.reps = 1;
    o.clock = [&] { return ticks++; };  // each timed run takes 1, the outer native one what the inner reads add
    o.store = store;
    precision::ShapeRouting routing(o);
    int inner_calls = 0;
    const auto native_with_inner = [&] {
      ++inner_calls;
      (void)routing.route_fp32("mm 2x2 2x2", nothing, nothing);
    };
    CHECK(routing.route_fp32("convolution 1x1x4x4 1x1x2x2", native_with_inner, nothing));  // native took 5 > 1
    CHECK(inner_calls == 1);
    const auto saved = precision::read_shape_store(store);
    CHECK(saved.size() == 5);
    CHECK(saved.count("mm 2x2 2x2") == 1);
    CHECK(saved.count("convolution 1x1x4x4 1x1x2x2") == 1);
  }
  // A damaged or foreign file is ignored and rewritten whole by the next decision.
  for (const std::string damaged :
       {std::string("{\"format\": \"refit-bf16-shape-routing/1\", \"decisions\": {\"mm 1x1 1x1\": {\"route\": \"fast\"}}}"),
        std::string("{\"format\": \"other\"}"), std::string("{\"format\": 3}"),
        std::string("{\"format\": \"refit-bf16-shape-routing/1\", \"decisions\": {\"mm 1x1 1x1\": {\"route\": \"fp32\", "
                    "\"native_seconds\": 1, \"fp32_seconds\": 1, \"native_given_up\": 3}}}"),
        std::string("{\"format\": \"refit-bf16-shape-routing/1\", \"decisions\": {\"mm 1x1 1x1\": {\"route\": \"fp32\", "
                    "\"native_seconds\": -1, \"fp32_seconds\": 1}}}"),
        std::string("not json"), std::string("")}) {
    INFO(damaged);
    { std::ofstream(store, std::ios::trunc) << damaged; }
    CHECK(precision::read_shape_store(store).empty());
    ScriptedClock clock;
    auto o = scripted(clock, 0, 1);
    o.store = store;
    precision::ShapeRouting routing(o);
    clock.durations = {1, 2};
    CHECK(routing.route_fp32("mm 64x64 64x64", nothing, nothing));
    CHECK(precision::read_shape_store(store).size() == 1);
  }
  // A store in a folder that cannot be written: decisions stay the process's own.
  {
    ScriptedClock clock;
    auto o = scripted(clock, 0, 1);
    o.store = (dir / "missing-folder" / "decisions.json").string();
    precision::ShapeRouting routing(o);
    clock.durations = {2, 1};
    CHECK_FALSE(routing.route_fp32("mm 64x64 64x64", nothing, nothing));
    CHECK_FALSE(routing.route_fp32("mm 64x64 64x64", nothing, nothing));
  }
}

}  // namespace refit_test_bf16_products
