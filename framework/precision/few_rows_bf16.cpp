#include "precision/few_rows_bf16.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "refit/error.h"

namespace refit::precision {

std::string isa_name(FewRowsIsa isa) {
  switch (isa) {
    case FewRowsIsa::avx512_bf16: return "AVX512-BF16";
    case FewRowsIsa::avx512: return "AVX-512";
    case FewRowsIsa::avx2: return "AVX2";
    case FewRowsIsa::none: break;
  }
  return "none";
}

namespace {

std::string upper_env(const char* name) {
  const char* v = std::getenv(name);
  std::string s = v ? v : "";
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// What the CPU has, without the environment's limits (tests run every loop it has).
FewRowsIsa cpu_best() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return FewRowsIsa::none;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")))
    return FewRowsIsa::avx2;
  return __builtin_cpu_supports("avx512bf16") ? FewRowsIsa::avx512_bf16 : FewRowsIsa::avx512;
#else
  return FewRowsIsa::none;
#endif
}

// cpu_best() within the environment's limits: ATen's vector ISA (ATEN_CPU_CAPABILITY=avx2 /
// default) caps the loops the same way; oneDNN's (ONEDNN_MAX_CPU_ISA) decides whether bf16
// instructions count as available, as the native kernels see them.
FewRowsIsa detect() {
  const FewRowsIsa best = cpu_best();
  const std::string aten = upper_env("ATEN_CPU_CAPABILITY");
  std::string onednn = upper_env("ONEDNN_MAX_CPU_ISA");
  if (onednn.empty()) onednn = upper_env("DNNL_MAX_CPU_ISA");
  const bool onednn_bf16 = onednn.empty() || onednn == "ALL" || onednn.find("BF16") != std::string::npos ||
                           onednn.find("AMX") != std::string::npos || onednn.find("AVX10") != std::string::npos ||
                           onednn.find("FP16") != std::string::npos;
  if (aten == "DEFAULT" || best == FewRowsIsa::none) return FewRowsIsa::none;
  if (aten == "AVX2") return FewRowsIsa::avx2;
  return best == FewRowsIsa::avx512_bf16 && !onednn_bf16 ? FewRowsIsa::avx512 : best;
}

// The operands as raw pointers and element strides: x [M, K] (row stride lda), W [N, K] (row
// stride ldw), the fp32 results [M, N] (row stride N), the bias [N] (stride bs) or null.
struct Problem {
  const std::uint16_t* x;
  const std::uint16_t* w;
  const std::uint16_t* bias;
  float* y;
  std::int64_t M, K, N, lda, ldw, bs;
};

#if defined(__x86_64__)
#define REFIT_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define REFIT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define REFIT_TARGET_AVX2 __attribute__((target("avx2,fma")))

// Sums an fp32 vector's lanes (the same tree for every product).
REFIT_TARGET_AVX512 inline float sum16(__m512 v) { return _mm512_reduce_add_ps(v); }
REFIT_TARGET_AVX2 inline float sum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// The upper 8 lanes of a 16-lane vector (AVX-512F alone: no AVX512DQ needed).
REFIT_TARGET_AVX512 inline __m256 high8(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// The address `elements` bf16 further on, for a prefetch (which never faults, past the end of the
// weight included): computed as an integer, since no such pointer may be formed.
inline const char* ahead(const std::uint16_t* p, std::int64_t elements) {
  return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) +
                                       static_cast<std::uintptr_t>(elements) * sizeof(std::uint16_t));
}

// Sums of four fp32 vectors' lanes, as [sum(a), sum(b), sum(c), sum(d)]: pairwise halves, the
// same tree for every output.
REFIT_TARGET_AVX512 inline __m128 sum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 512 -> 256: each vector's halves added.
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), high8(a));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), high8(b));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), high8(c));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), high8(d));
  // hadd: pairs within 128-bit lanes; twice gives each vector's 4 partial sums per lane.
  const __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// MB (<= 4) x rows against NB (<= 4) W rows: each loaded W vector serves every x row (up to 16
// accumulators, all in registers). The NB rows (a few KB) are read from memory once; each
// (x row, W row) pair has its own accumulator, and its sum does not depend on the other rows.
template <int MB, int NB>
REFIT_TARGET_AVX512BF16 void block_avx512_bf16(const std::uint16_t* const* x, const std::uint16_t* w, std::int64_t ldw,
                                               std::int64_t K, float* const* y) {
  const std::uint16_t* w0 = w;
  const std::uint16_t* w1 = w + (NB > 1 ? ldw : 0);
  const std::uint16_t* w2 = w + (NB > 2 ? 2 * ldw : 0);
  const std::uint16_t* w3 = w + (NB > 3 ? 3 * ldw : 0);
  const std::uint16_t* x0 = x[0];
  const std::uint16_t* x1 = MB > 1 ? x[1] : x[0];
  const std::uint16_t* x2 = MB > 2 ? x[2] : x[0];
  const std::uint16_t* x3 = MB > 3 ? x[3] : x[0];
  const __m512 z = _mm512_setzero_ps();
  __m512 a0 = z, a1 = z, a2 = z, a3 = z, b0 = z, b1 = z, b2 = z, b3 = z;
  __m512 c0 = z, c1 = z, c2 = z, c3 = z, d0 = z, d1 = z, d2 = z, d3 = z;
  // One step of 32 elements (a macro: a lambda would not inherit the function's target ISA).
#define REFIT_ROW(xp, r0, r1, r2, r3)                                    \
  {                                                                      \
    const __m512bh p = (__m512bh)_mm512_maskz_loadu_epi16(mask, xp + k); \
    r0 = _mm512_dpbf16_ps(r0, p, v0);                                    \
    if constexpr (NB > 1) r1 = _mm512_dpbf16_ps(r1, p, v1);              \
    if constexpr (NB > 2) r2 = _mm512_dpbf16_ps(r2, p, v2);              \
    if constexpr (NB > 3) r3 = _mm512_dpbf16_ps(r3, p, v3);              \
  }
#define REFIT_STEP(k_, mask_)                                                           \
  {                                                                                     \
    const std::int64_t k = k_;                                                          \
    const __mmask32 mask = mask_;                                                       \
    const __m512bh v0 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w0 + k);               \
    _mm_prefetch(ahead(w0 + k, 4 * ldw), _MM_HINT_T0);                                  \
    _mm_prefetch(ahead(w1 + k, 4 * ldw), _MM_HINT_T0);                                  \
    _mm_prefetch(ahead(w2 + k, 4 * ldw), _MM_HINT_T0);                                  \
    _mm_prefetch(ahead(w3 + k, 4 * ldw), _MM_HINT_T0);                                  \
    const __m512bh v1 = NB > 1 ? (__m512bh)_mm512_maskz_loadu_epi16(mask, w1 + k) : v0; \
    const __m512bh v2 = NB > 2 ? (__m512bh)_mm512_maskz_loadu_epi16(mask, w2 + k) : v0; \
    const __m512bh v3 = NB > 3 ? (__m512bh)_mm512_maskz_loadu_epi16(mask, w3 + k) : v0; \
    REFIT_ROW(x0, a0, a1, a2, a3)                                                       \
    if constexpr (MB > 1) REFIT_ROW(x1, b0, b1, b2, b3)                                 \
    if constexpr (MB > 2) REFIT_ROW(x2, c0, c1, c2, c3)                                 \
    if constexpr (MB > 3) REFIT_ROW(x3, d0, d1, d2, d3)                                 \
  }
  const std::int64_t full = K / 32 * 32;
  for (std::int64_t k0 = 0; k0 < full; k0 += 32) REFIT_STEP(k0, ~__mmask32{0})
  if (K > full) REFIT_STEP(full, static_cast<__mmask32>((std::uint64_t{1} << (K - full)) - 1))
#undef REFIT_STEP
#undef REFIT_ROW
  alignas(16) float r[4];
  const auto store = [&](float* out, __m512 s0, __m512 s1, __m512 s2, __m512 s3) {
    _mm_store_ps(r, sum4x16(s0, s1, s2, s3));
    for (int j = 0; j < NB; ++j) out[j] = r[j];
  };
  store(y[0], a0, a1, a2, a3);
  if constexpr (MB > 1) store(y[1], b0, b1, b2, b3);
  if constexpr (MB > 2) store(y[2], c0, c1, c2, c3);
  if constexpr (MB > 3) store(y[3], d0, d1, d2, d3);
}

template <int NB>
REFIT_TARGET_AVX512BF16 void rows_avx512_bf16(const std::uint16_t* x, std::int64_t lda, std::int64_t M,
                                              const std::uint16_t* w, std::int64_t ldw, std::int64_t K, float* y,
                                              std::int64_t ldy) {
  for (std::int64_t m = 0; m < M; m += 4) {
    const std::uint16_t* xs[4];
    float* ys[4];
    for (int i = 0; i < 4; ++i) {
      const bool row = m + i < M;  // a block of fewer rows uses only the first ones
      xs[i] = x + (row ? m + i : m) * lda;
      ys[i] = row ? y + (m + i) * ldy : nullptr;
    }
    switch (std::min<std::int64_t>(4, M - m)) {
      case 4: block_avx512_bf16<4, NB>(xs, w, ldw, K, ys); break;
      case 3: block_avx512_bf16<3, NB>(xs, w, ldw, K, ys); break;
      case 2: block_avx512_bf16<2, NB>(xs, w, ldw, K, ys); break;
      default: block_avx512_bf16<1, NB>(xs, w, ldw, K, ys);
    }
  }
}

// The FMA loops read fp32: x widened once per product, the NB W rows once per block (both
// exact), into scratch that stays in L1/L2. Rows are padded with zeros to the vector width. One
// loop per vector width, each with its own target ISA: a macro, since a template's instances
// would share one target attribute.
#define REFIT_FMA_ROWS(NAME, TARGET, VEC, WIDTH, ZERO, LOAD, FMADD, SUM)                                          \
  template <int NB>                                                                                               \
  TARGET void NAME(const float* x, std::int64_t M, const float* w, std::int64_t Kp, float* y, std::int64_t ldy) { \
    for (std::int64_t m = 0; m < M; ++m) {                                                                        \
      const float* xr = x + m * Kp;                                                                               \
      VEC a0 = ZERO(), a1 = a0, a2 = a0, a3 = a0;                                                                 \
      for (std::int64_t k = 0; k < Kp; k += WIDTH) {                                                              \
        const VEC xv = LOAD(xr + k);                                                                              \
        a0 = FMADD(xv, LOAD(w + k), a0);                                                                          \
        if constexpr (NB > 1) a1 = FMADD(xv, LOAD(w + Kp + k), a1);                                               \
        if constexpr (NB > 2) a2 = FMADD(xv, LOAD(w + 2 * Kp + k), a2);                                           \
        if constexpr (NB > 3) a3 = FMADD(xv, LOAD(w + 3 * Kp + k), a3);                                           \
      }                                                                                                           \
      float* yr = y + m * ldy;                                                                                    \
      yr[0] = SUM(a0);                                                                                            \
      if constexpr (NB > 1) yr[1] = SUM(a1);                                                                      \
      if constexpr (NB > 2) yr[2] = SUM(a2);                                                                      \
      if constexpr (NB > 3) yr[3] = SUM(a3);                                                                      \
    }                                                                                                             \
  }
REFIT_FMA_ROWS(rows_avx512, REFIT_TARGET_AVX512, __m512, 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_fmadd_ps, sum16)
REFIT_FMA_ROWS(rows_avx2, REFIT_TARGET_AVX2, __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps, sum8)
#undef REFIT_FMA_ROWS

// bf16 rows [rows, K] (row stride ld) widened into fp32 rows of Kp (zero-padded), prefetching
// the row `prefetch` elements further (0: none; a prefetch never faults, past the end included).
REFIT_TARGET_AVX2 void widen_rows(const std::uint16_t* src, std::int64_t ld, std::int64_t rows, std::int64_t K,
                                  std::int64_t Kp, float* dst, std::int64_t prefetch = 0) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint16_t* s = src + r * ld;
    float* d = dst + r * Kp;
    std::int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      // The next block's row (4 rows on): in cache by the time it is widened.
      if (prefetch && k % 32 == 0) _mm_prefetch(ahead(s + k, prefetch), _MM_HINT_T0);
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k));
      _mm256_storeu_ps(d + k, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
    }
    for (; k < K; ++k) d[k] = c10::detail::f32_from_bits(s[k]);
    for (; k < Kp; ++k) d[k] = 0.0f;
  }
}

template <class Rows>
void by_blocks(std::int64_t n0, std::int64_t n1, const Rows& rows) {
  for (std::int64_t n = n0; n < n1; n += 4) {
    switch (std::min<std::int64_t>(4, n1 - n)) {
      case 4: rows(n, std::integral_constant<int, 4>{}); break;
      case 3: rows(n, std::integral_constant<int, 3>{}); break;
      case 2: rows(n, std::integral_constant<int, 2>{}); break;
      default: rows(n, std::integral_constant<int, 1>{});
    }
  }
}

// Columns [n0, n1) of the fp32 results with `isa`; `xw`: x widened (FMA loops), row length Kp.
void columns(FewRowsIsa isa, const Problem& p, const float* xw, std::int64_t Kp, std::int64_t n0, std::int64_t n1) {
  if (isa == FewRowsIsa::avx512_bf16) {
    by_blocks(n0, n1, [&](std::int64_t n, auto nb) {
      rows_avx512_bf16<decltype(nb)::value>(p.x, p.lda, p.M, p.w + n * p.ldw, p.ldw, p.K, p.y + n, p.N);
    });
    return;
  }
  thread_local std::vector<float> wide;
  wide.resize(static_cast<std::size_t>(4 * Kp));
  by_blocks(n0, n1, [&](std::int64_t n, auto nb) {
    constexpr int NB = decltype(nb)::value;
    widen_rows(p.w + n * p.ldw, p.ldw, NB, p.K, Kp, wide.data(), 4 * p.ldw);
    if (isa == FewRowsIsa::avx512) rows_avx512<NB>(xw, p.M, wide.data(), Kp, p.y + n, p.N);
    else
      rows_avx2<NB>(xw, p.M, wide.data(), Kp, p.y + n, p.N);
  });
}
#endif

}  // namespace

bool few_rows_runs_here(FewRowsIsa isa) {
  static const FewRowsIsa best = cpu_best();
  return isa != FewRowsIsa::none && static_cast<int>(isa) <= static_cast<int>(best);
}

FewRowsIsa few_rows_isa() {
  static const FewRowsIsa isa = [] {
    if (const char* off = std::getenv("REFIT_FEW_ROWS_BF16"); off && std::string(off) == "0") return FewRowsIsa::none;
    return detect();
  }();
  return isa;
}

std::int64_t few_rows_limit(FewRowsIsa isa) {
  // bench/few_rows_bf16.cpp on SmolLM2's decoding shapes, weights from memory (2-core Intel Xeon,
  // AVX512-BF16; docs/performance.md, "Decoding"): the VDPBF16PS loop beats LibTorch's native bf16
  // kernel and the fp32 route on every shape up to 16 rows; the FMA loops, which widen each weight
  // block first, up to 4 (at 8 the route wins on some shapes).
  // REFIT_FEW_ROWS_MAX: another limit, for the benchmark to time more rows.
  static const std::int64_t forced = [] {
    const char* v = std::getenv("REFIT_FEW_ROWS_MAX");
    return v && std::atoll(v) > 0 ? std::min<std::int64_t>(std::atoll(v), 64) : 0;
  }();
  if (isa == FewRowsIsa::none) return 0;
  if (forced) return forced;
  return isa == FewRowsIsa::avx512_bf16 ? 16 : 4;
}

bool few_rows_bf16_fits(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias, FewRowsIsa isa) {
  if (isa == FewRowsIsa::none || a.dim() != 2 || b.dim() != 2) return false;
  if (a.scalar_type() != at::kBFloat16 || b.scalar_type() != at::kBFloat16 || !a.device().is_cpu() || !b.device().is_cpu())
    return false;
  const std::int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (M < 1 || M > few_rows_limit(isa) || K < 1 || N < 1 || b.size(0) != K) return false;
  if (a.stride(1) != 1 && K > 1) return false;
  if (b.stride(0) != 1 && K > 1) return false;  // b = Wᵀ: W's rows are contiguous
  if (a.is_conj() || b.is_conj() || a.is_neg() || b.is_neg()) return false;
  if (!bias.defined()) return true;
  if (bias.scalar_type() != at::kBFloat16 || !bias.device().is_cpu() || bias.is_neg()) return false;
  if (bias.dim() == 1) return bias.size(0) == N;
  return bias.dim() == 2 && bias.size(1) == N && (bias.size(0) == 1 || (bias.size(0) == M && bias.stride(0) == 0));
}

at::Tensor few_rows_bf16_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias, FewRowsIsa isa) {
  if (!few_rows_bf16_fits(a, b, bias, isa) || !few_rows_runs_here(isa))
    throw Error("few_rows_bf16_mm: operands or vector unit (" + isa_name(isa) + ") outside the kernel's cases");
  const std::int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  // The fp32 results before their rounding: every element is written by the loops before it is
  // read, so no zeroing (a decoding step's lm_head would clear 1.5 MB per token).
  const std::unique_ptr<float[]> y(new float[static_cast<std::size_t>(M * N)]);
  const at::Tensor bias_row = bias.defined() ? (bias.dim() == 2 ? bias.select(0, 0) : bias) : bias;
  Problem p{static_cast<const std::uint16_t*>(a.const_data_ptr()),
            static_cast<const std::uint16_t*>(b.const_data_ptr()),
            bias_row.defined() ? static_cast<const std::uint16_t*>(bias_row.const_data_ptr()) : nullptr,
            y.get(),
            M,
            K,
            N,
            M > 1 ? a.stride(0) : K,
            N > 1 ? b.stride(1) : K,
            bias_row.defined() ? bias_row.stride(0) : 0};
  // Columns split between threads in blocks of 4 W rows (8 K bytes each); a few W rows per task
  // are too little work to hand a thread: at least ~64 KB of weight per task.
  const std::int64_t blocks = (N + 3) / 4;
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 13) / std::max<std::int64_t>(K, 1));
  at::Tensor out = at::empty({M, N}, a.options().dtype(at::kBFloat16));
  auto* o = static_cast<std::uint16_t*>(out.data_ptr());
  // The FMA loops read x widened once (the bf16 loop reads it as it is).
  const std::int64_t Kp = (K + 15) / 16 * 16;
  std::vector<float> xw;
#if defined(__x86_64__)
  if (isa != FewRowsIsa::avx512_bf16) {
    xw.resize(static_cast<std::size_t>(M * Kp));
    widen_rows(p.x, p.lda, M, K, Kp, xw.data());
  }
#endif
  at::parallel_for(0, blocks, grain, [&](std::int64_t begin, std::int64_t end) {
    const std::int64_t n0 = begin * 4, n1 = std::min(N, end * 4);
#if defined(__x86_64__)
    columns(isa, p, xw.data(), Kp, n0, n1);
#endif
    // The bias added in fp32, then one rounding (as the fp32 route's addmm, then its cast).
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = n0; n < n1; ++n) {
        float v = p.y[m * N + n];
        if (p.bias) v += c10::detail::f32_from_bits(p.bias[n * p.bs]);
        o[m * N + n] = c10::detail::round_to_nearest_even(v);
      }
  });
  return out;
}

}  // namespace refit::precision
