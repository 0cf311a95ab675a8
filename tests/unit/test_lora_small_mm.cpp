// The LoRA plugin's CPU microkernel path for small bf16 products (plugins/lora/cpu_small_mm.h),
// compiled into this binary: every layout the one-node delta hands it, compared with at::mm bit
// for bit (LibTorch's own CPU kernel, at::cpu::mm: the process's per-shape route may send
// at::mm's bf16 products through fp32). On every CPU the first case checks that the LoRA delta
// uses the path exactly where its first-use results check passed (not the CPU flags restated);
// where it is off the comparisons cannot run (the kernel needs AVX512-BF16 and the layout it
// packs is not AMX's), and those cases print "REFIT-SKIPPED:", which ctest reports as skipped
// (tests/CMakeLists.txt), not as passed. Tagged [hardware]: ctest runs each case on its own, never
// in its file's group.
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>

#include <ATen/native/CPUBlas.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <torch/types.h>

#include "../../plugins/lora/cpu_small_mm.h"
#include "../../plugins/lora/fused_delta.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_lora_small_mm {

using namespace refit::lora;

namespace {
torch::Tensor bf16(torch::IntArrayRef shape, double scale = 1.0) {
  return (torch::randn(shape) * scale).to(torch::kBFloat16);
}

/// Where the microkernel cannot run (no AVX512-BF16, or AMX's layout), a case that compares its
/// results has nothing to run: it says so in a line ctest turns into "Skipped"
/// (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt). Where it can, the comparisons run whatever
/// its first-use self-check decided, so a wrong product fails them (not only turns the path off).
bool skipped_without_path() {
  if (small_mm_bf16_supported()) return false;
  std::cout << "REFIT-SKIPPED: the LoRA CPU microkernel cannot run on this CPU (needs AVX512-BF16 without AMX)" << std::endl;
  return true;
}
}  // namespace

TEST_CASE("LoRA CPU microkernel: the LoRA delta takes it exactly where its first-use check against LibTorch passed",
          "[hardware]") {
  // Whether the path is on is decided by results (its first products against LibTorch's own
  // kernel, every packing branch: small_mm_bf16_available), not restated here from CPU flags.
  // Where it is on, the delta's bf16 forward and backward run their six products through it;
  // elsewhere (no AVX512-BF16, AMX, REFIT_LORA_SMALL_MM=0) none do, and the delta is LibTorch's.
  torch::manual_seed(3);
  const auto x = torch::randn({64, 512}).to(torch::kBFloat16).requires_grad_();
  const auto A = (torch::randn({16, 512}) * 0.05).to(torch::kBFloat16).requires_grad_();
  const auto B = (torch::randn({512, 16}) * 0.05).to(torch::kBFloat16).requires_grad_();
  const bool on = small_mm_bf16_available();  // (its self-check runs first: not counted below)
  const auto before = small_mm_bf16_calls();
  fused_linear_delta(x, A, B, 2.0).sum().backward();
  CHECK(small_mm_bf16_calls() - before == (on ? 6u : 0u));
  // Where it can run, its self-check passed (a wrong product turns it off, and fails here).
  const char* off = std::getenv("REFIT_LORA_SMALL_MM");
  if (!(off && std::string(off) == "0")) CHECK(on == small_mm_bf16_supported());
  CHECK(x.grad().defined());
  CHECK(A.grad().defined());
  CHECK(B.grad().defined());
}

TEST_CASE("LoRA CPU microkernel: small bf16 products equal at::mm bit for bit, every layout", "[hardware]") {
  if (skipped_without_path()) return;
  torch::manual_seed(11);
  // The six products of the 12 x 512 MLP benchmark's LoRA layer (batch 64, rank 16) ...
  auto x = bf16({64, 512}), A = bf16({16, 512}, 0.05), B = bf16({512, 16}, 0.05), g = bf16({64, 512}, 1e-3);
  auto xa = at::cpu::mm(x, A.t()), gxa = at::cpu::mm(g, B);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> cases = {{x, A.t()}, {xa, B.t()},  {g, B},
                                                                {gxa, A},   {gxa.t(), x}, {g.t(), xa}};
  // ... and odd, tiny and strided shapes (an odd K is padded with a zero row).
  cases.push_back({bf16({7, 37}), bf16({37, 5})});
  cases.push_back({bf16({1, 64}), bf16({64, 16})});
  cases.push_back({bf16({16, 1}), bf16({1, 300})});
  cases.push_back({bf16({33, 9}).t(), bf16({40, 33}).t()});
  // A row-major A and B^T in place: computed as C^T = B^T A^T, A^T packed from a column view (its
  // odd K's last row padded there).
  cases.push_back({bf16({4, 37}), bf16({64, 37}).t()});
  cases.push_back({bf16({8, 100}).slice(1, 0, 100, 2), bf16({100, 24}).slice(0, 0, 100, 2)});
  cases.push_back({bf16({64, 16}, 1e4), bf16({16, 512}, 1e-4)});  // wide dynamic range
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& [a, b] = cases[i];
    INFO("case " << i << ": " << a.sizes() << " (strides " << a.strides() << ") x " << b.sizes() << " (strides "
                 << b.strides() << ")");
    auto got = small_mm_bf16(a, b), want = at::cpu::mm(a, b);
    CHECK(got.scalar_type() == torch::kBFloat16);
    CHECK(got.sizes() == want.sizes());
    CHECK(got.is_contiguous());
    CHECK(torch::equal(got, want));
  }
  // Non-finite operands propagate as at::mm's do (NaN where it has NaN, inf where inf).
  auto a = bf16({4, 32}), b = bf16({32, 8});
  a[1][3] = std::numeric_limits<float>::quiet_NaN();
  a[2][5] = std::numeric_limits<float>::infinity();
  auto got = small_mm_bf16(a, b).to(torch::kFloat), want = at::cpu::mm(a, b).to(torch::kFloat);
  CHECK(torch::equal(got.isnan(), want.isnan()));
  CHECK(torch::equal(got.isinf(), want.isinf()));
  CHECK(torch::equal(got.nan_to_num(0, 0, 0), want.nan_to_num(0, 0, 0)));
}

TEST_CASE("LoRA CPU microkernel: fp32 operands are rounded as packed, an fp32 result is the bf16 one widened",
          "[hardware]") {
  if (skipped_without_path()) return;
  torch::manual_seed(5);
  auto A = torch::randn({16, 512}) * 0.05, x = torch::randn({64, 512}), g = torch::randn({64, 512}) * 1e-3;
  auto h = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  // The forward's x A^T with fp32 A (autocast would cast it first), fp32 x too, and transposed.
  CHECK(torch::equal(small_mm_bf16(h(x), A.t()), at::cpu::mm(h(x), h(A).t())));
  CHECK(torch::equal(small_mm_bf16(x, A.t()), at::cpu::mm(h(x), h(A).t())));
  CHECK(torch::equal(small_mm_bf16(A, x.t()), at::cpu::mm(h(A), h(x).t())));
  // d A = (g B)^T x with an fp32 result: ToCopyBackward's widening of the bf16 product.
  auto gb = h(torch::randn({64, 16}));
  auto dA = small_mm_bf16(gb.t(), h(x), torch::kFloat);
  CHECK(dA.scalar_type() == torch::kFloat);
  CHECK(torch::equal(dA, at::cpu::mm(gb.t(), h(x)).to(torch::kFloat)));
  CHECK(torch::equal(small_mm_bf16(h(g).t(), gb, torch::kFloat), at::cpu::mm(h(g).t(), gb).to(torch::kFloat)));
  // fp32 operands through the strided (neither rows nor columns contiguous) packing branch.
  auto xs = torch::randn({40, 60}).slice(1, 0, 60, 2), ws = torch::randn({60, 24}).slice(0, 0, 60, 2);
  CHECK(torch::equal(small_mm_bf16(xs, ws, torch::kFloat), at::cpu::mm(h(xs), h(ws)).to(torch::kFloat)));
  CHECK(torch::equal(small_mm_bf16(ws.t().slice(0, 0, 24, 2), xs.t(), torch::kFloat),
                     at::cpu::mm(h(ws.t().slice(0, 0, 24, 2)), h(xs.t())).to(torch::kFloat)));
  CHECK_THROWS_WITH(small_mm_bf16(x.to(torch::kDouble), A.t()), Catch::Contains("bf16 or fp32 CPU operands"));
}

TEST_CASE("LoRA CPU microkernel: only small products, and at most 64 row counts, are routed to it", "[hardware]") {
  for (std::int64_t rows = 1; rows <= 64; ++rows) CHECK(small_mm_bf16_admit(rows * 1000));
  CHECK(small_mm_bf16_admit(5000));         // admitted before: still admitted
  CHECK_FALSE(small_mm_bf16_admit(65001));  // a 65th row count: at::mm
  CHECK(small_mm_bf16_fits(64, 512, 16));
  CHECK(small_mm_bf16_fits(16, 64, 512));
  CHECK_FALSE(small_mm_bf16_fits(64, 512, 512));   // a frozen base product: at::mm's two threads win
  CHECK_FALSE(small_mm_bf16_fits(2048, 192, 16));  // the quickstart ViT's token-many rows
}

}  // namespace refit_test_lora_small_mm
