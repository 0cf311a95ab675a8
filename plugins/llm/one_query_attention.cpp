#include "one_query_attention.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <algorithm>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "refit/error.h"

namespace refit::llm {

namespace {

inline float value(float x) { return x; }
inline float value(std::uint16_t bits) {  // a bf16's bits widened to fp32 (exact)
  const std::uint32_t u = std::uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Scores of one (sequence, head) pair: q [D] against L key rows (row stride k_row), scaled, -inf
// where `allowed` (stride a_step; null: all) is false. Inlined into each vector width's version
// below, which vectorises the D loops.
template <class T>
__attribute__((always_inline)) inline void pair_scores(const T* q, const T* k, std::int64_t k_row, const bool* allowed,
                                                       std::int64_t a_step, std::int64_t L, std::int64_t D, float scale,
                                                       float* qf, float* scores) {
  for (std::int64_t d = 0; d < D; ++d) qf[d] = value(q[d]);
  for (std::int64_t j = 0; j < L; ++j) {
    if (allowed && !allowed[j * a_step]) {
      scores[j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const T* kj = k + j * k_row;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (std::int64_t d = 0; d < D; ++d) s += qf[d] * value(kj[d]);
    scores[j] = s * scale;
  }
}

// out [D] = sum_j p_j v_j over L value rows (row stride v_row); p_j = 0 rows are skipped.
template <class T>
__attribute__((always_inline)) inline void pair_values(const float* p, const T* v, std::int64_t v_row, std::int64_t L,
                                                       std::int64_t D, float* out) {
  for (std::int64_t d = 0; d < D; ++d) out[d] = 0;
  for (std::int64_t j = 0; j < L; ++j) {
    if (p[j] == 0) continue;
    const T* vj = v + j * v_row;
    const float pj = p[j];
#pragma omp simd
    for (std::int64_t d = 0; d < D; ++d) out[d] += pj * value(vj[d]);
  }
}

// Each loop per vector width (chosen once, below): AVX-512, AVX2 with FMA, and the compiler's
// baseline.
#define REFIT_WIDTHS(NAME, BODY, PARAMS, ARGS)                                                               \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void NAME##_avx512 PARAMS { BODY ARGS; } \
  __attribute__((target("avx2,fma"))) void NAME##_avx2 PARAMS { BODY ARGS; }                                 \
  void NAME##_baseline PARAMS { BODY ARGS; }
#define REFIT_SCORE_PARAMS(T)                                                                                            \
  (const T* q, const T* k, std::int64_t k_row, const bool* allowed, std::int64_t a_step, std::int64_t L, std::int64_t D, \
   float scale, float* qf, float* scores)
#define REFIT_VALUE_PARAMS(T) (const float* p, const T* v, std::int64_t v_row, std::int64_t L, std::int64_t D, float* out)
REFIT_WIDTHS(scores_f32, pair_scores, REFIT_SCORE_PARAMS(float), (q, k, k_row, allowed, a_step, L, D, scale, qf, scores))
REFIT_WIDTHS(scores_bf16, pair_scores, REFIT_SCORE_PARAMS(std::uint16_t),
             (q, k, k_row, allowed, a_step, L, D, scale, qf, scores))
REFIT_WIDTHS(values_f32, pair_values, REFIT_VALUE_PARAMS(float), (p, v, v_row, L, D, out))
REFIT_WIDTHS(values_bf16, pair_values, REFIT_VALUE_PARAMS(std::uint16_t), (p, v, v_row, L, D, out))
#undef REFIT_VALUE_PARAMS
#undef REFIT_SCORE_PARAMS
#undef REFIT_WIDTHS

enum class Width { avx512, avx2, baseline };
Width width() {
  static const Width w = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
      return Width::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Width::avx2;
#endif
    return Width::baseline;
  }();
  return w;
}

// The loops for T at this CPU's width.
template <class T>
void scores(const T* q, const T* k, std::int64_t k_row, const bool* allowed, std::int64_t a_step, std::int64_t L,
            std::int64_t D, float scale, float* qf, float* out) {
  const Width w = width();
  if constexpr (std::is_same_v<T, float>) {
    if (w == Width::avx512) return scores_f32_avx512(q, k, k_row, allowed, a_step, L, D, scale, qf, out);
    if (w == Width::avx2) return scores_f32_avx2(q, k, k_row, allowed, a_step, L, D, scale, qf, out);
    return scores_f32_baseline(q, k, k_row, allowed, a_step, L, D, scale, qf, out);
  } else {
    if (w == Width::avx512) return scores_bf16_avx512(q, k, k_row, allowed, a_step, L, D, scale, qf, out);
    if (w == Width::avx2) return scores_bf16_avx2(q, k, k_row, allowed, a_step, L, D, scale, qf, out);
    return scores_bf16_baseline(q, k, k_row, allowed, a_step, L, D, scale, qf, out);
  }
}

template <class T>
void values(const float* p, const T* v, std::int64_t v_row, std::int64_t L, std::int64_t D, float* out) {
  const Width w = width();
  if constexpr (std::is_same_v<T, float>) {
    if (w == Width::avx512) return values_f32_avx512(p, v, v_row, L, D, out);
    if (w == Width::avx2) return values_f32_avx2(p, v, v_row, L, D, out);
    return values_f32_baseline(p, v, v_row, L, D, out);
  } else {
    if (w == Width::avx512) return values_bf16_avx512(p, v, v_row, L, D, out);
    if (w == Width::avx2) return values_bf16_avx2(p, v, v_row, L, D, out);
    return values_bf16_baseline(p, v, v_row, L, D, out);
  }
}

// The two passes for element type T (float, or bf16 as its bits).
template <class T>
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& allowed) {
  const std::int64_t B = q.size(0), H = q.size(1), D = q.size(3), KVH = k.size(1), L = k.size(2), group = H / KVH;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const auto* qp = static_cast<const T*>(q.const_data_ptr());
  const auto* kp = static_cast<const T*>(k.const_data_ptr());
  const auto* vp = static_cast<const T*>(v.const_data_ptr());
  const auto* a = allowed.defined() ? allowed.const_data_ptr<bool>() : nullptr;
  const std::int64_t a_step = a ? allowed.stride(3) : 0;
  // Pass 1: every pair's scores. Each pair's work is L x D multiply-adds: tens of pairs a task.
  torch::Tensor s = torch::empty({B * H, L}, q.options().dtype(torch::kFloat));
  float* sp = s.data_ptr<float>();
  at::parallel_for(0, B * H, 16, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> qf(static_cast<std::size_t>(D));
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t b = i / H, h = i % H, g = h / group;
      scores<T>(qp + b * q.stride(0) + h * q.stride(1), kp + b * k.stride(0) + g * k.stride(1), k.stride(2),
                a ? a + b * allowed.stride(0) : nullptr, a_step, L, D, scale, qf.data(), sp + i * L);
    }
  });
  // The softmax (LibTorch's, vectorised exp): a row with no allowed key is NaN there, zeros below.
  const torch::Tensor p = at::softmax(s, -1);
  const float* pp = p.const_data_ptr<float>();
  torch::Tensor out = torch::empty({B, H, 1, D}, q.options().memory_format(c10::MemoryFormat::Contiguous));
  // Pass 2: the weighted sums of values, rounded once to q's dtype.
  at::parallel_for(0, B * H, 16, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> acc(static_cast<std::size_t>(D));
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t b = i / H, h = i % H, g = h / group;
      const float* row = pp + i * L;
      const bool empty = std::isnan(row[0]);
      if (empty) std::fill(acc.begin(), acc.end(), 0.0f);
      else
        values<T>(row, vp + b * v.stride(0) + g * v.stride(1), v.stride(2), L, D, acc.data());
      if constexpr (std::is_same_v<T, float>) {
        std::copy(acc.begin(), acc.end(), out.data_ptr<float>() + i * D);
      } else {
        auto* o = static_cast<c10::BFloat16*>(out.data_ptr()) + i * D;
        for (std::int64_t d = 0; d < D; ++d) o[d] = c10::BFloat16(acc[static_cast<std::size_t>(d)]);  // nearest even
      }
    }
  });
  return out;
}

}  // namespace

bool one_query_attention_fits(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& allowed) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || q.size(2) != 1) return false;
  const auto dtype = q.scalar_type();
  if ((dtype != torch::kFloat && dtype != torch::kBFloat16) || k.scalar_type() != dtype || v.scalar_type() != dtype)
    return false;
  if (!q.device().is_cpu() || !k.device().is_cpu() || !v.device().is_cpu()) return false;
  const std::int64_t B = q.size(0), H = q.size(1), D = q.size(3), KVH = k.size(1), L = k.size(2);
  if (B < 1 || H < 1 || D < 1 || KVH < 1 || L < 1 || H % KVH != 0) return false;
  if (k.sizes() != v.sizes() || k.size(0) != B || k.size(3) != D) return false;
  if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1) return false;
  if (!allowed.defined()) return true;
  return allowed.scalar_type() == torch::kBool && allowed.device().is_cpu() &&
         allowed.sizes() == torch::IntArrayRef({B, 1, 1, L});
}

torch::Tensor one_query_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& allowed) {
  if (!one_query_attention_fits(q, k, v, allowed))
    throw Error("one_query_attention: expected q [B, H, 1, D] and k, v [B, KVH, L, D] on the CPU in float32 or "
                "bfloat16 (H a multiple of KVH), an optional bool mask [B, 1, 1, L]; got q " +
                c10::str(q.sizes()) + ", k " + c10::str(k.sizes()) + ", v " + c10::str(v.sizes()));
  return q.scalar_type() == torch::kBFloat16 ? attend<std::uint16_t>(q, k, v, allowed) : attend<float>(q, k, v, allowed);
}

}  // namespace refit::llm
