// Few-row bf16 products (precision/few_rows_bf16.h): every vector loop this CPU runs computes each
// output as the exact product of the bf16 operands, summed in fp32 and rounded once, within the
// bound that arithmetic allows (derived below); a row's results do not depend on the rows beside
// it; the bf16 route sends decoding's shapes to it and no others; and refit's own at::parallel_for
// loops run on the intra-op threads (compiled with OpenMP), which the kernel and the NF4 loops need.
// Tagged [hardware]: a case whose kernel this CPU lacks prints "REFIT-SKIPPED:", so ctest runs
// each case on its own (reported skipped, not passed), never in its file's group.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <iostream>
#include <vector>

#include "precision/bf16_products.h"
#include "precision/few_rows_bf16.h"
#include "precision/shape_routing.h"
#include "quant/gguf_blocks.h"
#include "quant/quantize.h"
#include "refit/quantized.h"
#include "run/run_environment.h"
#include "scripted_clock.h"
#include "quantized_test_weights.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_few_rows_bf16 {

using namespace refit;
using namespace refit::precision;

namespace {

at::Tensor bf16_randn(std::vector<std::int64_t> shape, std::uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g, at::kFloat).to(at::kBFloat16);
}

/// A case with nothing to run on this machine says so in a line ctest reports as skipped
/// (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt).
void skipped(const char* why) { std::cout << "REFIT-SKIPPED: " << why << std::endl; }

std::vector<FewRowsIsa> loops_here() {
  std::vector<FewRowsIsa> out;
  for (auto isa : {FewRowsIsa::avx2, FewRowsIsa::avx512, FewRowsIsa::avx512_bf16})
    if (few_rows_runs_here(isa)) out.push_back(isa);
  return out;
}

/// |r - exact| within the arithmetic's bound, element by element. With s = Σ_k |x_k w_k| (+|bias|),
/// the fp32 sum v of K exact products (and the bias) is within γ_{K+1}(2^-24)·s of the exact value
/// (any summation order, Higham's bound); rounding v to bf16 moves it by at most 2^-8·|v|, and
/// |v| <= |exact| + that first error. A wrong element, a lost tail or a missing bias is off by a
/// term of s's size, far outside.
void check_within_bound(const at::Tensor& r, const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble);
  at::Tensor exact = at::mm(xd, wd.t()), s = at::mm(xd.abs(), wd.abs().t());
  if (bias.defined()) exact = exact + bias.to(at::kDouble), s = s + bias.to(at::kDouble).abs();
  const double K = static_cast<double>(x.size(1)) + 1, u32 = std::ldexp(1.0, -24);
  const at::Tensor sum_error = s * (K * u32 / (1 - K * u32));
  const at::Tensor bound = sum_error + std::ldexp(1.0, -8) * (exact.abs() + sum_error);
  const at::Tensor excess = (r.to(at::kDouble) - exact).abs() - bound;
  INFO("largest error beyond the bound: " << excess.max().item<double>());
  CHECK(excess.max().item<double>() <= 0);
}

}  // namespace

TEST_CASE("parallel loops: refit's at::parallel_for runs on the intra-op threads", "[hardware]") {
  // ATen's parallel_for is inline: a unit compiled without OpenMP runs it on one thread, which
  // once left refit's NF4 (de)quantization serial. Compiled into refit_core, this checks its flags.
  if (at::get_num_threads() < 2) return skipped("one intra-op thread");
  CHECK(parallel_loop_threads() == at::get_num_threads());
}

TEST_CASE("few-row bf16 products: every vector loop here is the exact product summed in fp32 and rounded once, "
          "within the derived bound, for every edge of the blocking",
          "[hardware]") {
  const auto loops = loops_here();
  if (loops.empty()) return skipped("no AVX2 on this CPU: the kernel does not run");
  std::uint64_t seed = 1;
  for (const FewRowsIsa isa : loops) {
    INFO(isa_name(isa));
    // M: the FMA loops' blocks of 8 (AVX-512) and 4 (AVX2) rows, whole and partial.
    for (const std::int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16}) {
      if (M > few_rows_limit(isa)) continue;
      // K: below, at and past each loop's vector width and its tail, and past the FMA loops'
      // segment of 768 (two and three segments, of unequal lengths); N: every edge of the blocks.
      for (const std::int64_t K : {1, 7, 8, 15, 16, 31, 32, 33, 100, 576, 769, 1600}) {
        for (const std::int64_t N : {1, 3, 4, 5, 17}) {
          INFO("M " << M << " K " << K << " N " << N);
          // Padded rows (leading dimensions above K), as a view of a larger buffer gives.
          const at::Tensor x = bf16_randn({M, K + 3}, seed++).narrow(1, 0, K);
          const at::Tensor w = bf16_randn({N, K + 5}, seed++).narrow(1, 0, K);
          const at::Tensor bias = bf16_randn({N}, seed++);
          REQUIRE(few_rows_bf16_fits(x, w.t(), {}, isa));
          check_within_bound(few_rows_bf16_mm(x, w.t(), {}, isa), x, w, {});
          check_within_bound(few_rows_bf16_mm(x, w.t(), bias, isa), x, w, bias);
        }
      }
    }
  }
}

TEST_CASE("few-row bf16 products: a weight split between threads, and every bias form the kernel takes", "[hardware]") {
  const auto loops = loops_here();
  if (loops.empty()) return skipped("no AVX2 on this CPU: the kernel does not run");
  // 1,025 blocks of 4 rows of 32 (a partial last block): several tasks when there are threads.
  const at::Tensor x = bf16_randn({3, 32}, 31), w = bf16_randn({4099, 32}, 32), bias = bf16_randn({4099}, 33);
  for (const FewRowsIsa isa : loops) {
    INFO(isa_name(isa));
    check_within_bound(few_rows_bf16_mm(x, w.t(), {}, isa), x, w, {});
    const at::Tensor with_bias = few_rows_bf16_mm(x, w.t(), bias, isa);
    check_within_bound(with_bias, x, w, bias);
    // [1, N], [M, N] broadcast from [N] (stride 0), a strided [N]: the same sums.
    CHECK(at::equal(few_rows_bf16_mm(x, w.t(), bias.unsqueeze(0), isa), with_bias));
    CHECK(at::equal(few_rows_bf16_mm(x, w.t(), bias.expand({3, 4099}), isa), with_bias));
    const at::Tensor strided = at::zeros({2 * 4099}, at::kBFloat16).slice(0, 0, 2 * 4099, 2).copy_(bias);
    CHECK(at::equal(few_rows_bf16_mm(x, w.t(), strided, isa), with_bias));
  }
  // A full [M, N] bias is addmm's general case, not the kernel's.
  CHECK_FALSE(few_rows_bf16_fits(x, w.t(), bf16_randn({3, 4099}, 34)));
}

TEST_CASE("few-row bf16 products: a row's results do not depend on the rows beside it", "[hardware]") {
  const auto loops = loops_here();
  if (loops.empty()) return skipped("no AVX2 on this CPU: the kernel does not run");
  const at::Tensor w = bf16_randn({200, 576}, 12);
  for (const FewRowsIsa isa : loops) {
    INFO(isa_name(isa));
    const std::int64_t rows = few_rows_limit(isa);
    const at::Tensor x = bf16_randn({rows, 576}, 11);
    const at::Tensor all = few_rows_bf16_mm(x, w.t(), {}, isa);
    for (std::int64_t m = 0; m < rows; ++m)
      CHECK(at::equal(few_rows_bf16_mm(x.narrow(0, m, 1), w.t(), {}, isa), all[m].unsqueeze(0)));
  }
}

TEST_CASE("few-row bf16 products: the bf16 route sends decoding's shapes to the kernel, and only those", "[hardware]") {
  const FewRowsIsa isa = few_rows_isa();
  if (isa == FewRowsIsa::none)
    return skipped("the kernel is off here (no AVX2, ATEN_CPU_CAPABILITY=default or REFIT_FEW_ROWS_BF16=0)");
  Bf16Route route;
  const at::Tensor x = bf16_randn({4, 1, 96}, 21), w = bf16_randn({40, 96}, 22), bias = bf16_randn({40}, 23);
  const at::Tensor x2 = x.view({4, 96});
  // linear without and with a bias (mm, and addmm with a broadcast bias).
  CHECK(at::equal(at::linear(x, w).view({4, 40}), few_rows_bf16_mm(x2, w.t(), {}, isa)));
  CHECK(at::equal(at::linear(x2, w, bias), few_rows_bf16_mm(x2, w.t(), bias, isa)));
  auto out = at::empty({0}, at::kBFloat16);
  at::mm_out(out, x2, w.t());
  CHECK(at::equal(out, few_rows_bf16_mm(x2, w.t(), {}, isa)));
  // Outside its cases: too many rows, a weight not stored row-major, fp32, scaled addmm.
  const at::Tensor many = bf16_randn({few_rows_limit(isa) + 1, 96}, 24);
  CHECK_FALSE(few_rows_bf16_fits(many, w.t()));
  CHECK_FALSE(few_rows_bf16_fits(x2, w.t().contiguous()));
  CHECK_FALSE(few_rows_bf16_fits(x2.to(at::kFloat), w.t().to(at::kFloat)));
  CHECK_FALSE(few_rows_bf16_fits(x2.t().contiguous().t(), w.t()));  // x's columns strided
  const auto calls = bf16_routed_calls();
  (void)at::mm(x2, w.t());                                         // counted as routed
  const at::Tensor scaled = at::addmm(bias, x2, w.t(), 0.5, 2.0);  // the route's fp32 side
  CHECK(bf16_routed_calls() - calls == 2);
  CHECK(at::equal(scaled,
                  at::addmm(bias.to(at::kFloat), x2.to(at::kFloat), w.t().to(at::kFloat), 0.5, 2.0).to(at::kBFloat16)));
  CHECK_THROWS_WITH(few_rows_bf16_mm(many, w.t()), Catch::Contains("outside the kernel's cases"));
}

using refit::test::ScriptedClock;

TEST_CASE("few-row bf16 products: where VDPBF16PS runs, the per-shape policy keeps the faster of it and the FMA loop "
          "per weight shape, whatever the rows",
          "[hardware]") {
  if (few_rows_isa() != FewRowsIsa::avx512_bf16) return skipped("no AVX512-BF16 here: the FMA loop is the only one");
  ScriptedClock clock;
  ShapeRoutingOptions o;
  o.warmups = 1;
  o.reps = 1;
  o.clock = [&clock] { return clock.read(); };
  ShapeRouting routing(o);
  Bf16Route route(&routing);
  const at::Tensor x = bf16_randn({8, 96}, 31), w = bf16_randn({40, 96}, 32), w2 = bf16_randn({24, 200}, 33),
                   x2 = bf16_randn({8, 200}, 34);
  // The FMA loop (the policy's fp32 side, timed first) 1, VDPBF16PS's warm-up and run 5 each.
  clock.durations = {1, 5, 5};
  CHECK(at::equal(at::linear(x, w), few_rows_bf16_mm(x, w.t(), {}, FewRowsIsa::avx512)));
  // One row, the same weight shape: decided, nothing timed (the script is spent), the same loop.
  CHECK(at::equal(at::linear(x.narrow(0, 0, 1), w), few_rows_bf16_mm(x.narrow(0, 0, 1), w.t(), {}, FewRowsIsa::avx512)));
  // Another weight shape where VDPBF16PS wins.
  clock.durations.insert(clock.durations.end(), {5, 1, 1});
  CHECK(at::equal(at::linear(x2, w2), few_rows_bf16_mm(x2, w2.t(), {}, FewRowsIsa::avx512_bf16)));
  const auto table = routing.decisions();
  REQUIRE(table.size() == 2);
  for (const auto& d : table) {
    INFO(d.shape_class);
    CHECK(d.shape_class.rfind("few-rows ", 0) == 0);
    CHECK(d.fp32 == (d.shape_class == shape_class("few-rows", {{96, 40}})));
  }
}

TEST_CASE("few-row NF4 products: the weight dequantized in registers gives the FMA loop's product of the "
          "dequantized weight, bit for bit",
          "[hardware]") {
  if (!few_rows_runs_here(FewRowsIsa::avx512) || few_rows_isa() == FewRowsIsa::avx2 || few_rows_isa() == FewRowsIsa::none)
    return skipped("no AVX-512 loop here (or ATen limited to AVX2): NF4 products dequantize first");
  std::uint64_t seed = 41;
  for (const bool doubled : {false, true})
    for (const std::int64_t blocksize : {64, 32, 128})
      for (const std::int64_t K : {128, 800})  // one K segment, two (of 768)
        for (const std::int64_t N : {1, 37}) {
          if (K % blocksize) continue;
          const at::Tensor w = bf16_randn({N, K}, seed++).to(at::kFloat);
          quant::Nf4Options o;
          o.blocksize = blocksize;
          o.double_quantization = doubled;
          const quant::Nf4Weight q = quant::quantize_nf4(w, o);
          const at::Tensor dense = quant::dequantize_nf4(q, at::kBFloat16);
          Nf4Rows rows;
          rows.packed = q.packed.const_data_ptr<std::uint8_t>();
          if (doubled) {
            rows.absmax_u8 = q.absmax.const_data_ptr<std::uint8_t>();
            rows.absmax_scale = q.absmax_scale.const_data_ptr<float>();
            rows.offset = q.offset;
          } else {
            rows.absmax_f32 = q.absmax.const_data_ptr<float>();
          }
          rows.blocksize = blocksize;
          rows.absmax_blocksize = q.absmax_blocksize;
          const at::Tensor bias = bf16_randn({N}, seed++);
          for (const std::int64_t M : {1, 3, 8, 11, 16}) {
            INFO("double " << doubled << " blocksize " << blocksize << " K " << K << " N " << N << " M " << M);
            const at::Tensor x = bf16_randn({M, K}, seed++);
            REQUIRE(few_rows_nf4_fits(x, N, K, blocksize));
            CHECK(at::equal(few_rows_nf4_mm(x, rows, N, K), few_rows_bf16_mm(x, dense.t(), {}, FewRowsIsa::avx512)));
            CHECK(at::equal(few_rows_nf4_mm(x, rows, N, K, bias), few_rows_bf16_mm(x, dense.t(), bias, FewRowsIsa::avx512)));
          }
        }
  // Outside its cases: K not a multiple of 32, a blocksize that does not divide K, too many rows.
  CHECK_FALSE(few_rows_nf4_fits(bf16_randn({2, 48}, 1), 4, 48, 16));
  CHECK_FALSE(few_rows_nf4_fits(bf16_randn({2, 96}, 1), 4, 96, 64));
  CHECK_FALSE(few_rows_nf4_fits(bf16_randn({17, 64}, 1), 4, 64, 64));
  CHECK_FALSE(few_rows_nf4_fits(bf16_randn({2, 64}, 1).to(at::kFloat), 4, 64, 64));
}

TEST_CASE("few-row int8 products: the weight dequantized in registers gives the FMA loop's product of the "
          "dequantized weight, bit for bit",
          "[hardware]") {
  if (!few_rows_runs_here(FewRowsIsa::avx512) || few_rows_isa() == FewRowsIsa::avx2 || few_rows_isa() == FewRowsIsa::none)
    return skipped("no AVX-512 loop here (or ATen limited to AVX2): int8 products dequantize first");
  std::uint64_t seed = 61;
  for (const std::int64_t K : {64, 800})
    for (const std::int64_t N : {1, 37}) {
      const quant::Int8Weight q = quant::quantize_int8(bf16_randn({N, K}, seed++).to(at::kFloat) * 3);
      const at::Tensor dense = quant::dequantize_int8(q, at::kBFloat16);
      const at::Tensor bias = bf16_randn({N}, seed++);
      for (const std::int64_t M : {1, 3, 8, 11, 16}) {
        INFO("K " << K << " N " << N << " M " << M);
        const at::Tensor x = bf16_randn({M, K}, seed++);
        REQUIRE(few_rows_int8_fits(x, N, K));
        const auto* w = q.weight.const_data_ptr<std::int8_t>();
        const float* scale = q.scale.const_data_ptr<float>();
        CHECK(at::equal(few_rows_int8_mm(x, w, scale, N, K), few_rows_bf16_mm(x, dense.t(), {}, FewRowsIsa::avx512)));
        CHECK(
            at::equal(few_rows_int8_mm(x, w, scale, N, K, bias), few_rows_bf16_mm(x, dense.t(), bias, FewRowsIsa::avx512)));
      }
    }
  CHECK_FALSE(few_rows_int8_fits(bf16_randn({2, 48}, 1), 4, 48));
  CHECK_FALSE(few_rows_int8_fits(bf16_randn({17, 64}, 1), 4, 64));
}

TEST_CASE("few-row GGUF products: Q4_0, Q4_1 and Q8_0 blocks dequantized in registers give the FMA loop's product "
          "of the dequantized weight, bit for bit, AVX-512 and AVX2",
          "[hardware]") {
  std::vector<FewRowsIsa> loops;
  for (auto isa : {FewRowsIsa::avx2, FewRowsIsa::avx512})
    if (few_rows_runs_here(isa)) loops.push_back(isa);
  if (loops.empty()) return skipped("no AVX2 on this CPU: GGUF products dequantize first");
  std::uint64_t seed = 71;
  const std::pair<io::GgufType, GgufBlockType> types[] = {{io::GgufType::Q4_0, GgufBlockType::q4_0},
                                                          {io::GgufType::Q4_1, GgufBlockType::q4_1},
                                                          {io::GgufType::Q8_0, GgufBlockType::q8_0}};
  for (const auto& [type, block_type] : types)
    for (const std::int64_t K : {64, 800})  // one K segment, two (of 768)
      for (const std::int64_t N : {1, 37}) {
        const quant::GgufBlocks b = test::synthetic_gguf_blocks(type, N, K, seed++);
        const at::Tensor dense = quant::dequantize_gguf_blocks(b, at::kBFloat16);
        const at::Tensor bias = bf16_randn({N}, seed++);
        for (const FewRowsIsa isa : loops)
          for (const std::int64_t M : {1, 3, 8, 11, 16}) {
            INFO(io::gguf_type_name(type) << " K " << K << " N " << N << " M " << M << " isa " << static_cast<int>(isa));
            const at::Tensor x = bf16_randn({M, K}, seed++);
            REQUIRE(few_rows_gguf_fits(x, N, K, isa));
            const auto* blocks = b.blocks.const_data_ptr<std::uint8_t>();
            CHECK(
                at::equal(few_rows_gguf_mm(x, blocks, block_type, N, K, {}, isa), few_rows_bf16_mm(x, dense.t(), {}, isa)));
            CHECK(at::equal(few_rows_gguf_mm(x, blocks, block_type, N, K, bias, isa),
                            few_rows_bf16_mm(x, dense.t(), bias, isa)));
          }
      }
  // A NaN scale read from a file (0xFFFF: a high payload, which integer rounding alone would
  // carry into a zero) stays a NaN, as in the dequantized weight: the same rows NaN, the rest equal.
  for (const auto& [type, block_type] : types) {
    quant::GgufBlocks b = test::synthetic_gguf_blocks(type, 5, 64, seed++);
    b.blocks[2][0] = 0xFF, b.blocks[2][1] = 0xFF;  // row 2's first block: d = NaN
    const at::Tensor dense = quant::dequantize_gguf_blocks(b, at::kBFloat16);
    REQUIRE(dense[2][0].isnan().item<bool>());
    const at::Tensor x = bf16_randn({3, 64}, seed++);
    for (const FewRowsIsa isa : loops) {
      INFO(io::gguf_type_name(type) << " isa " << static_cast<int>(isa));
      const at::Tensor got = few_rows_gguf_mm(x, b.blocks.const_data_ptr<std::uint8_t>(), block_type, 5, 64, {}, isa);
      const at::Tensor want = few_rows_bf16_mm(x, dense.t(), {}, isa);
      CHECK(at::equal(got.isnan(), want.isnan()));
      CHECK(got.isnan().select(1, 2).all().item<bool>());
      CHECK(at::equal(got.nan_to_num(0), want.nan_to_num(0)));
    }
  }
  CHECK_FALSE(few_rows_gguf_fits(bf16_randn({2, 48}, 1), 4, 48));
  CHECK_FALSE(few_rows_gguf_fits(bf16_randn({17, 64}, 1), 4, 64));
}

}  // namespace refit_test_few_rows_bf16
