// The llama plugin's inference loops (plugins/llm/one_query_attention.h, fused_inference.h), each
// against an exact float64 computation with a bound derived from its arithmetic, and the fused
// rotation against its composite form bit for bit; refit generate's greedy choice against argmax.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include "cli/commands/generate.h"
#include "llm/fused_inference.h"
#include "llm/one_query_attention.h"
#include "numeric_bounds.h"
#include "test_support.h"

namespace refit_test_llama_inference {

using namespace refit;
using namespace refit::test;

namespace {

torch::Tensor randn(at::IntArrayRef sizes, std::uint64_t seed, c10::ScalarType dtype) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, g, torch::TensorOptions().dtype(torch::kFloat)).to(dtype);
}

// SDPA's arithmetic in float64 on the operands' values: [B, H, 1, D] queries, GQA by
// repeat_interleave (transformers' repeat_kv), a bool mask [B, 1, 1, L]. Also the weights p.
std::pair<torch::Tensor, torch::Tensor> exact_attention(const torch::Tensor& q, const torch::Tensor& k,
                                                        const torch::Tensor& v, const torch::Tensor& allowed) {
  const std::int64_t group = q.size(1) / k.size(1);
  const torch::Tensor qd = q.to(torch::kDouble), kd = k.to(torch::kDouble).repeat_interleave(group, 1),
                      vd = v.to(torch::kDouble).repeat_interleave(group, 1);
  const torch::Tensor s = at::matmul(qd, kd.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(3)));
  const torch::Tensor p = at::softmax(s.masked_fill(allowed.logical_not(), -INFINITY), -1);
  return {at::matmul(p, vd), p};
}

}  // namespace

TEST_CASE("llama inference: one-query attention is SDPA's fp32 arithmetic, with GQA, padding and an empty row") {
  const std::int64_t B = 3, H = 6, KVH = 2, L = 11, D = 64;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    INFO(c10::toString(dtype));
    const torch::Tensor q = randn({B, H, 1, D}, 1, dtype);
    // The cache's layout: a view of the first L of 16 positions.
    const torch::Tensor k = randn({B, KVH, 16, D}, 2, dtype).narrow(2, 0, L);
    const torch::Tensor v = randn({B, KVH, 16, D}, 3, dtype).narrow(2, 0, L);
    torch::Tensor allowed = torch::ones({B, 1, 1, L}, torch::kBool);
    allowed[1].narrow(-1, 0, 4).fill_(false);  // left padding
    allowed[2].fill_(false);                   // no key at all: zeros
    REQUIRE(llm::one_query_attention_fits(q, k, v, allowed));
    const torch::Tensor out = llm::one_query_attention(q, k, v, allowed);
    CHECK(out.scalar_type() == dtype);
    CHECK(out.sizes() == q.sizes());
    CHECK(torch::equal(out[2], torch::zeros_like(out[2])));
    const auto [exact, p] =
        exact_attention(q.narrow(0, 0, 2), k.narrow(0, 0, 2), v.narrow(0, 0, 2), allowed.narrow(0, 0, 2));
    // Scores: D products summed in fp32 and scaled: score j within e_j = g_D+1 S_j, S_j = scale
    // sum_d |q_d k_jd| (g: the probabilistic form, numeric_bounds.h). Moving score j by e_j moves
    // the output by p_j (v_j - o) e_j to first order (the softmax's derivative); summed over the
    // keys, sum_j p_j S_j |v_j - o| g_D+1. The softmax itself (exp, L terms summed, a division)
    // and the weighted sum of L values add g_2L+4 relative to sum_j p_j |v_j|; then one rounding
    // to the output's dtype, u_out |o|.
    const double u = kUnitFp32;
    const std::int64_t group = H / KVH;
    const torch::Tensor q2 = q.narrow(0, 0, 2).to(torch::kDouble), k2 = k.narrow(0, 0, 2).to(torch::kDouble),
                        v2 = v.narrow(0, 0, 2).to(torch::kDouble).repeat_interleave(group, 1);
    const torch::Tensor S =
        at::matmul(q2.abs(), k2.abs().repeat_interleave(group, 1).transpose(-1, -2)) / std::sqrt(double(D));
    const torch::Tensor bound = prob_gamma(D + 1, u) * at::matmul(p * S, (v2 - exact).abs()) +
                                prob_gamma(2 * L + 4, u) * at::matmul(p, v2.abs()) + unit_roundoff(dtype) * exact.abs();
    const double ratio = bound_ratio(out.narrow(0, 0, 2), exact, bound);
    std::printf("one-query attention (%s): error / bound %.3g\n", c10::toString(dtype), ratio);
    check_bound_ratio(std::string("one-query attention vs exact, ") + c10::toString(dtype), ratio);
    if (dtype == torch::kFloat) {
      // SDPA itself (its fp32 kernel) on the same operands: within the same bound.
      const torch::Tensor sdpa = at::scaled_dot_product_attention(q.narrow(0, 0, 2), k.narrow(0, 0, 2), v.narrow(0, 0, 2),
                                                                  allowed.narrow(0, 0, 2), 0.0, false, c10::nullopt,
                                                                  /*enable_gqa=*/true);
      CHECK(bound_ratio(sdpa, exact, bound) <= 1);
    }
  }
  // Outside its cases: two queries, fp16, a mask of another shape, H not a multiple of KVH.
  const torch::Tensor q = randn({1, 4, 1, 8}, 4, torch::kFloat), k = randn({1, 2, 5, 8}, 5, torch::kFloat);
  CHECK_FALSE(llm::one_query_attention_fits(randn({1, 4, 2, 8}, 6, torch::kFloat), k, k, {}));
  CHECK_FALSE(llm::one_query_attention_fits(q.to(torch::kHalf), k.to(torch::kHalf), k.to(torch::kHalf), {}));
  CHECK_FALSE(llm::one_query_attention_fits(q, k, k, torch::ones({1, 1, 2, 5}, torch::kBool)));
  CHECK_FALSE(llm::one_query_attention_fits(randn({1, 3, 1, 8}, 7, torch::kFloat), k, k, {}));
  CHECK(llm::one_query_attention_fits(q, k, k, {}));
  CHECK_THROWS_WITH(llm::one_query_attention(q, k.narrow(3, 0, 4), k.narrow(3, 0, 4)),
                    Catch::Contains("one_query_attention: expected"));
}

TEST_CASE("llama inference: the fused RMSNorm is within its rounding of the exact norm, as the composite is") {
  const std::int64_t D = 576;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    INFO(c10::toString(dtype));
    const torch::Tensor x = randn({5, 2, D}, 8, dtype) * 3, w = randn({D}, 9, dtype);
    const double eps = 1e-5;
    REQUIRE(llm::rms_norm_inference_fits(x, w));
    const torch::Tensor out = llm::rms_norm_inference(x, w, eps);
    const torch::Tensor xd = x.to(torch::kDouble), wd = w.to(torch::kDouble);
    const torch::Tensor scale = at::rsqrt(xd.pow(2).mean(-1, true) + eps);
    const torch::Tensor exact = wd * xd * scale;
    // The mean of D squares in fp32 (relative g_D: positive terms), + eps, sqrt, reciprocal: the
    // scale within g_D / 2 + 3u; x * scale and w * h each one rounding to the dtype (u_out).
    const double u = kUnitFp32, uo = unit_roundoff(dtype);
    const double rel = prob_gamma(D, u) / 2 + 3 * u + 2 * uo + uo * uo;
    const torch::Tensor bound = rel * exact.abs();
    const double ratio = bound_ratio(out, exact, bound);
    // The composite (llama.cpp's RMSNorm::forward) meets the same bound.
    const torch::Tensor h = x.to(torch::kFloat);
    const torch::Tensor composite = w * (h * at::rsqrt(h.pow(2).mean(-1, true) + eps)).to(dtype);
    std::printf("fused RMSNorm (%s): error / bound %.3g (composite %.3g)\n", c10::toString(dtype), ratio,
                bound_ratio(composite, exact, bound));
    check_bound_ratio(std::string("fused RMSNorm vs exact, ") + c10::toString(dtype), ratio);
    CHECK(bound_ratio(composite, exact, bound) <= 1);
  }
  CHECK_FALSE(llm::rms_norm_inference_fits(randn({2, 8}, 10, torch::kBFloat16), randn({8}, 11, torch::kFloat)));
  CHECK_FALSE(llm::rms_norm_inference_fits(randn({8, 2}, 10, torch::kFloat).t(), randn({8}, 11, torch::kFloat)));
}

TEST_CASE("llama inference: the fused rotation equals x cos + rotate_half(x) sin bit for bit") {
  const std::int64_t B = 2, H = 3, T = 5, D = 16;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    INFO(c10::toString(dtype));
    // heads(): [B, T, H, D] viewed as [B, H, T, D], as the attention forms it.
    const torch::Tensor x = randn({B, T, H, D}, 12, dtype).transpose(1, 2);
    const torch::Tensor angles = randn({B, T, D}, 13, torch::kFloat) * 4;
    const torch::Tensor cos = angles.cos().to(dtype).unsqueeze(1), sin = angles.sin().to(dtype).unsqueeze(1);
    REQUIRE(llm::rotate_inference_fits(x, cos, sin));
    const std::int64_t half = D / 2;
    const torch::Tensor composite = x * cos + at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1) * sin;
    const torch::Tensor fused = llm::rotate_inference(x, cos, sin);
    CHECK(fused.is_contiguous());
    CHECK(torch::equal(fused, composite));
  }
  const torch::Tensor x = randn({1, 1, 2, 6}, 14, torch::kFloat);
  CHECK_FALSE(
      llm::rotate_inference_fits(x, randn({1, 1, 2, 6}, 15, torch::kBFloat16), randn({1, 1, 2, 6}, 15, torch::kBFloat16)));
  CHECK_FALSE(llm::rotate_inference_fits(x.narrow(-1, 0, 5), x.narrow(-1, 0, 5), x.narrow(-1, 0, 5)));
  CHECK(llm::rotate_inference_fits(x, x, x));
}

TEST_CASE("generate: greedy next tokens are argmax's: the first of equal maxima, the first NaN, any layout") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(16);
  cli::SamplingOptions greedy;  // temperature 0
  torch::Tensor logits = randn({4, 49152}, 17, torch::kFloat);
  logits[1][7] = 100;
  logits[1][9000] = 100;  // a tie: the first
  logits[2][3] = std::numeric_limits<float>::quiet_NaN();
  logits[2][40000] = std::numeric_limits<float>::quiet_NaN();  // NaN: the first, as argmax
  logits[3].fill_(-1);
  const torch::Tensor got = cli::next_tokens(logits, greedy, gen);
  CHECK(torch::equal(got, logits.argmax(-1)));
  CHECK(got[1].item<std::int64_t>() == 7);
  CHECK(got[2].item<std::int64_t>() == 3);
  CHECK(got[3].item<std::int64_t>() == 0);
  const torch::Tensor strided = logits.t().contiguous().t();  // another layout: LibTorch's argmax
  CHECK(torch::equal(cli::next_tokens(strided, greedy, gen), logits.argmax(-1)));
}

}  // namespace refit_test_llama_inference
