// The LoRA plugin's CPU microkernel path for small bf16 products (plugins/lora/cpu_small_mm.h),
// compiled into this binary: every layout the one-node delta hands it, compared with at::mm bit
// for bit (LibTorch's own CPU kernel, at::cpu::mm: the process's per-shape route may send
// at::mm's bf16 products through fp32). On every CPU the first case checks that the path is on exactly where the CPU has what
// it needs (AVX512-BF16 without AMX, REFIT_LORA_SMALL_MM not 0) and off elsewhere; where it is off
// the comparisons cannot run, and those cases print "REFIT-SKIPPED:", which ctest reports as
// skipped (tests/CMakeLists.txt), not as passed.
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>

#include <ATen/native/CPUBlas.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <torch/types.h>

#include "../../plugins/lora/cpu_small_mm.h"
#include "test_support.h"

using namespace refit::lora;

namespace {
torch::Tensor bf16(torch::IntArrayRef shape, double scale = 1.0) {
  return (torch::randn(shape) * scale).to(torch::kBFloat16);
}

/// Whether oneDNN may use AVX512-BF16: ONEDNN_MAX_CPU_ISA below it (the portable tests set AVX2
/// to see an AVX2-only CPU) leaves it no bf16 microkernel to build.
bool onednn_allows_bf16() {
  for (const char* var : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    std::string isa(v);
    for (auto& c : isa) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return isa == "ALL" || isa.find("BF16") != std::string::npos || isa.find("FP16") != std::string::npos ||
           isa.find("AMX") != std::string::npos || isa.find("AVX10") != std::string::npos;
  }
  return true;
}

/// Whether this CPU and environment call for the path: AVX512-BF16 that oneDNN may use, no AMX
/// (ATen packs for it instead), REFIT_LORA_SMALL_MM not "0".
bool path_wanted() {
  const char* off = std::getenv("REFIT_LORA_SMALL_MM");
  return __builtin_cpu_supports("avx512bf16") && onednn_allows_bf16() &&
         !at::native::cpublas::could_pack(torch::kBFloat16) && !(off && std::string(off) == "0");
}

/// Where the path is off, a case that compares its results has nothing to run: it says so in a
/// line ctest turns into "Skipped" (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt).
bool skipped_without_path() {
  if (small_mm_bf16_available()) return false;
  std::cout << "REFIT-SKIPPED: the LoRA CPU microkernel is off on this CPU (needs AVX512-BF16 without AMX)" << std::endl;
  return true;
}
}  // namespace

TEST_CASE("LoRA CPU microkernel: on exactly where the CPU has AVX512-BF16 without AMX") {
  // On where wanted (its first-use self-check against at::mm passed), off elsewhere: running it
  // without AVX512-BF16 would be an illegal instruction, with AMX it would lose to ATen's packing.
  CHECK(small_mm_bf16_available() == path_wanted());
}

TEST_CASE("LoRA CPU microkernel: small bf16 products equal at::mm bit for bit, every layout") {
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

TEST_CASE("LoRA CPU microkernel: fp32 operands are rounded as packed, an fp32 result is the bf16 one widened") {
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

TEST_CASE("LoRA CPU microkernel: only small products, and at most 64 row counts, are routed to it") {
  for (std::int64_t rows = 1; rows <= 64; ++rows) CHECK(small_mm_bf16_admit(rows * 1000));
  CHECK(small_mm_bf16_admit(5000));         // admitted before: still admitted
  CHECK_FALSE(small_mm_bf16_admit(65001));  // a 65th row count: at::mm
  CHECK(small_mm_bf16_fits(64, 512, 16));
  CHECK(small_mm_bf16_fits(16, 64, 512));
  CHECK_FALSE(small_mm_bf16_fits(64, 512, 512));   // a frozen base product: at::mm's two threads win
  CHECK_FALSE(small_mm_bf16_fits(2048, 192, 16));  // the quickstart ViT's token-many rows
}
