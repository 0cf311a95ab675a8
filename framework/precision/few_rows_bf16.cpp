#include "precision/few_rows_bf16.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "refit/error.h"
#include "refit/quantized.h"

// GCC 12 reports its own AVX-512 intrinsics (extracts, reductions, shifts) as reading an
// uninitialised vector: they pass an undefined source under an all-ones mask (a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

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

// NF4's 16 values (bitsandbytes' table, refit/quantized.h) as the kernel reads them.
const float* nf4_table() {
  static const std::array<float, 16> table = refit::quant::nf4_code();
  return table.data();
}

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

// The FMA loops widen bf16 to fp32 (exact) in registers, without shuffles: a chunk of 2V bf16 W
// elements loaded as V 32-bit lanes gives its even elements (the low halves, shifted up 16 bits)
// and its odd ones (the high halves, the low 16 bits cleared) as two fp32 vectors. x is split the
// same way once per product (split_rows), so each lane multiplies matching elements: per chunk,
// acc += x_even * w_even, then acc += x_odd * w_odd. Two fused multiply-adds per 2V elements and
// x row, against VDPBF16PS's one: on a CPU whose FMA units have twice its throughput (this
// machine's Xeon: 2 FMAs a cycle, one VDPBF16PS every 2), the FMA loop is the faster one, and
// bf16_products.cpp times both on first use where both run.
//
// Each block is MB x rows (all in L1) against NB W rows, MB x NB accumulators in registers: each
// W chunk is loaded and widened once for every x row of the block. A W row read now also
// prefetches the same chunk `kPrefetchRows` rows on (decoding streams every weight once).
constexpr std::int64_t kPrefetchRows = 8;

#define REFIT_SPLIT_ROWS(SUFFIX, TARGET, V, LOADW_FULL, LOADW_TAIL, EVEN, ODD)                                  \
  /* x rows [rows, K] (row stride ld) split per chunk of 2V elements into V even then V odd ones, */            \
  /* widened, zero-padded: rows of `chunks` x 2V floats. */                                                     \
  TARGET void split_rows_##SUFFIX(const std::uint16_t* src, std::int64_t ld, std::int64_t rows, std::int64_t K, \
                                  float* dst) {                                                                 \
    const std::int64_t chunks = (K + 2 * V - 1) / (2 * V);                                                      \
    for (std::int64_t r = 0; r < rows; ++r)                                                                     \
      for (std::int64_t c = 0; c < chunks; ++c) {                                                               \
        const std::uint16_t* s = src + r * ld + c * 2 * V;                                                      \
        const std::int64_t n = std::min<std::int64_t>(2 * V, K - c * 2 * V);                                    \
        float* d = dst + (r * chunks + c) * 2 * V;                                                              \
        const auto v = n == 2 * V ? LOADW_FULL(s) : LOADW_TAIL(s, n);                                           \
        STORE_##SUFFIX(d, EVEN(v));                                                                             \
        STORE_##SUFFIX(d + V, ODD(v));                                                                          \
      }                                                                                                         \
  }

#define STORE_avx512 _mm512_storeu_ps
#define STORE_avx2 _mm256_storeu_ps
REFIT_TARGET_AVX512 inline __m512i load32_full(const std::uint16_t* p) { return _mm512_loadu_si512(p); }
REFIT_TARGET_AVX512 inline __m512i load32_tail(const std::uint16_t* p, std::int64_t n) {
  return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((std::uint64_t{1} << n) - 1), p);
}
REFIT_TARGET_AVX512 inline __m512 even16(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
REFIT_TARGET_AVX512 inline __m512 odd16(__m512i v) {
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
REFIT_TARGET_AVX2 inline __m256i load16_full(const std::uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// AVX2 has no 16-bit masked load: a short last chunk is copied into zeros.
REFIT_TARGET_AVX2 inline __m256i load16_tail(const std::uint16_t* p, std::int64_t n) {
  alignas(32) std::uint16_t t[16] = {};
  std::memcpy(t, p, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
}
REFIT_TARGET_AVX2 inline __m256 even8(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
REFIT_TARGET_AVX2 inline __m256 odd8(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
REFIT_SPLIT_ROWS(avx512, REFIT_TARGET_AVX512, 16, load32_full, load32_tail, even16, odd16)
REFIT_SPLIT_ROWS(avx2, REFIT_TARGET_AVX2, 8, load16_full, load16_tail, even8, odd8)
#undef REFIT_SPLIT_ROWS

// bf16 weights for the FMA loops: a W row's chunk of 2V elements (a short last one zero-padded)
// as its even and odd elements in fp32 (exact), prefetching the same chunk kPrefetchRows rows on.
#define REFIT_BF16_DECODE(NAME, TARGET, VEC, VECI, V, FULL, TAIL, EVEN, ODD)              \
  struct NAME {                                                                           \
    const std::uint16_t* w;                                                               \
    std::int64_t ldw, K;                                                                  \
    TARGET void operator()(std::int64_t row, std::int64_t c, VEC& even, VEC& odd) const { \
      const std::uint16_t* wr = w + row * ldw + c * 2 * V;                                \
      _mm_prefetch(ahead(wr, kPrefetchRows* ldw), _MM_HINT_T0);                           \
      const std::int64_t n = std::min<std::int64_t>(2 * V, K - c * 2 * V);                \
      const VECI v = n == 2 * V ? FULL(wr) : TAIL(wr, n);                                 \
      even = EVEN(v);                                                                     \
      odd = ODD(v);                                                                       \
    }                                                                                     \
  };
REFIT_BF16_DECODE(Bf16Decode, REFIT_TARGET_AVX512, __m512, __m512i, 16, load32_full, load32_tail, even16, odd16)
REFIT_BF16_DECODE(Bf16Decode8, REFIT_TARGET_AVX2, __m256, __m256i, 8, load16_full, load16_tail, even8, odd8)
#undef REFIT_BF16_DECODE
#undef STORE_avx512
#undef STORE_avx2

template <int MB, int NB, class F>
bool dispatch_block(int mb, int nb, const F& f) {
  if (mb == MB && nb == NB) return f(std::integral_constant<int, MB>{}, std::integral_constant<int, NB>{}), true;
  return false;
}

template <class F, int... Ms>
void for_block(int mb, int nb, const F& f, std::integer_sequence<int, Ms...>) {
  (void)((dispatch_block<Ms + 1, 1>(mb, nb, f) || dispatch_block<Ms + 1, 2>(mb, nb, f)) || ...);
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

// Columns [n0, n1) of the fp32 results with the VDPBF16PS loop (the FMA loops: decoded_mm below).
void columns_avx512_bf16(const Problem& p, std::int64_t n0, std::int64_t n1) {
  by_blocks(n0, n1, [&](std::int64_t n, auto nb) {
    rows_avx512_bf16<decltype(nb)::value>(p.x, p.lda, p.M, p.w + n * p.ldw, p.ldw, p.K, p.y + n, p.N);
  });
}

// The FMA loops over decoded weights: a decoder gives a W row's chunk of 2V elements as its even
// and odd elements in fp32 (the layout split_rows gives x): bf16 weights widened (Bf16Decode),
// quantized ones (few_rows_nf4_mm, few_rows_int8_mm) decoded and rounded to bf16 as their
// dequantized weight holds them. One block serves all, so a quantized weight's product is the
// bf16 FMA loop's on its dequantized weight, in the same order.
REFIT_TARGET_AVX512 inline __m512 round_to_bf16(__m512 v) {  // nearest even, in integer arithmetic
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

REFIT_TARGET_AVX512 inline void prefetch_ahead(const std::uint8_t* p, std::int64_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(bytes)),
               _MM_HINT_T0);
}

// NF4: a chunk is 16 bytes, byte i holding element 2i in its high nibble and 2i + 1 in its low
// one. Widened to 32-bit lanes, the bytes give the even elements' codes (shifted down 4) and the
// odd ones' (masked); each code becomes its value (a permute of the 16-entry table), times the
// block's maximum (fp32), rounded to bf16: the values dequantize_nf4(q, bf16) holds.
struct Nf4Decode {
  const std::uint8_t* packed;
  const float* maxima;  // per block, double quantization undone
  std::int64_t row_bytes, blocks_per_row, chunks_per_block;
  REFIT_TARGET_AVX512 void operator()(std::int64_t row, std::int64_t c, __m512& even, __m512& odd) const {
    const std::uint8_t* bytes = packed + row * row_bytes + c * 16;
    prefetch_ahead(bytes, kPrefetchRows * row_bytes);
    const __m512 table = _mm512_loadu_ps(nf4_table());
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
    const __m512 m = _mm512_set1_ps(maxima[row * blocks_per_row + c / chunks_per_block]);
    even = round_to_bf16(_mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table), m));
    odd = round_to_bf16(_mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)), table), m));
  }
};

// int8 (LLM.int8()'s weight-only rows): a chunk is 32 bytes; as 16 two-byte lanes widened to 32
// bits, the low byte of each is an even element and the high byte an odd one (sign-extended by
// shifts); each times its row's scale, times 1/127 (dequantize_int8_fast's two fp32 products, in
// its order), rounded to bf16.
struct Int8Decode {
  const std::int8_t* weight;
  const float* scale;
  std::int64_t K;
  REFIT_TARGET_AVX512 void operator()(std::int64_t row, std::int64_t c, __m512& even, __m512& odd) const {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(weight + row * K + c * 32);
    prefetch_ahead(bytes, kPrefetchRows * K);
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
    const __m512 s = _mm512_set1_ps(scale[row]), inv127 = _mm512_set1_ps(static_cast<float>(7.874015718698502e-3));
    const __m512 e = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24));
    const __m512 o = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 16), 24));
    even = round_to_bf16(_mm512_mul_ps(_mm512_mul_ps(e, s), inv127));
    odd = round_to_bf16(_mm512_mul_ps(_mm512_mul_ps(o, s), inv127));
  }
};

// The same decoders and block for AVX2 (8 lanes: chunks of 16 elements, 4 x 2 accumulators), the
// AVX2 FMA loop's arithmetic and order. NF4's 16-entry table is two 8-entry permutes, the code's
// bit 3 choosing between them.
REFIT_TARGET_AVX2 inline __m256 round_to_bf16_8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

REFIT_TARGET_AVX2 inline __m256 nf4_values_8(__m256i codes) {
  const __m256 low = _mm256_loadu_ps(nf4_table()), high = _mm256_loadu_ps(nf4_table() + 8);
  const __m256 upper = _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28));  // bit 3 as the sign
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, codes), _mm256_permutevar8x32_ps(high, codes), upper);
}

struct Nf4Decode8 {
  const std::uint8_t* packed;
  const float* maxima;
  std::int64_t row_bytes, blocks_per_row, chunks_per_block;  // chunks of 16 elements
  REFIT_TARGET_AVX2 void operator()(std::int64_t row, std::int64_t c, __m256& even, __m256& odd) const {
    const std::uint8_t* bytes = packed + row * row_bytes + c * 8;
    _mm_prefetch(ahead(reinterpret_cast<const std::uint16_t*>(bytes), kPrefetchRows * row_bytes / 2), _MM_HINT_T0);
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
    const __m256 m = _mm256_set1_ps(maxima[row * blocks_per_row + c / chunks_per_block]);
    even = round_to_bf16_8(_mm256_mul_ps(nf4_values_8(_mm256_srli_epi32(v, 4)), m));
    odd = round_to_bf16_8(_mm256_mul_ps(nf4_values_8(_mm256_and_si256(v, _mm256_set1_epi32(15))), m));
  }
};

struct Int8Decode8 {
  const std::int8_t* weight;
  const float* scale;
  std::int64_t K;
  REFIT_TARGET_AVX2 void operator()(std::int64_t row, std::int64_t c, __m256& even, __m256& odd) const {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(weight + row * K + c * 16);
    _mm_prefetch(ahead(reinterpret_cast<const std::uint16_t*>(bytes), kPrefetchRows * K / 2), _MM_HINT_T0);
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
    const __m256 s = _mm256_set1_ps(scale[row]), inv127 = _mm256_set1_ps(static_cast<float>(7.874015718698502e-3));
    const __m256 e = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24));
    const __m256 o = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 24));
    even = round_to_bf16_8(_mm256_mul_ps(_mm256_mul_ps(e, s), inv127));
    odd = round_to_bf16_8(_mm256_mul_ps(_mm256_mul_ps(o, s), inv127));
  }
};

// GGUF blocks (llama.cpp's Q4_0, Q4_1, Q8_0, kept as read: quant/gguf_blocks.h): 32 elements a
// block with an fp16 scale d (and an fp16 minimum m for Q4_1). Q4's element j < 16 is the low
// nibble of byte j, j + 16 its high nibble; Q8_0's element j is the signed byte j. The values are
// gguf-py's (io/gguf.h's row function): d (q - 8), d q + m, q d, each rounded to bf16. d q is
// exact in fp32 (an 11-bit significand times an integer of at most 8 bits), so whether the
// compiler fuses Q4_1's product and sum or not, the sum rounds once, as gguf-py's. d and m come
// from the file unchecked: a NaN scale must stay a NaN (0x7FC0, as c10's cast and the
// dequantizing path give), which the integer rounding alone would turn into a zero for high NaN
// payloads. d and m through a 65,536-entry table (ggml's way: one load a block), exact as
// c10::Half's conversion.
const float* fp16_to_float_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (std::uint32_t h = 0; h < 65536; ++h)
      t[h] = static_cast<float>(c10::Half(static_cast<std::uint16_t>(h), c10::Half::from_bits()));
    return t;
  }();
  return table.data();
}

inline std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

REFIT_TARGET_AVX512 inline __m512 round_to_bf16_keep_nan(__m512 v) {
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, round_to_bf16(v), _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

struct GgufDecode {
  const std::uint8_t* blocks;
  const float* fp16;
  std::int64_t row_bytes, block_bytes;
  GgufBlockType type;
  // AVX-512: a chunk is one block. The 16 quant bytes as 8 two-byte lanes, twice: lanes 0-7 give
  // elements 0-15 (the low nibbles), lanes 8-15 elements 16-31 (the high ones); a lane's low byte
  // holds an even element, its high byte the next odd one.
  REFIT_TARGET_AVX512 void operator()(std::int64_t row, std::int64_t c, __m512& even, __m512& odd) const {
    const std::uint8_t* b = blocks + row * row_bytes + c * block_bytes;
    prefetch_ahead(b, kPrefetchRows * row_bytes);
    const __m512 d = _mm512_set1_ps(fp16[load_u16(b)]);
    if (type == GgufBlockType::q8_0) {
      const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)));
      const __m512 e = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24));
      const __m512 o = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 16), 24));
      even = round_to_bf16_keep_nan(_mm512_mul_ps(e, d));
      odd = round_to_bf16_keep_nan(_mm512_mul_ps(o, d));
      return;
    }
    const bool q4_1 = type == GgufBlockType::q4_1;
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (q4_1 ? 4 : 2)));
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_broadcastsi128_si256(qs));
    const __m512i low_high = _mm512_set_epi32(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i nibble = _mm512_set1_epi32(15);
    const __m512 e = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, low_high), nibble));
    const __m512 o =
        _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, _mm512_add_epi32(low_high, _mm512_set1_epi32(8))), nibble));
    if (!q4_1) {
      const __m512 eight = _mm512_set1_ps(8);
      even = round_to_bf16_keep_nan(_mm512_mul_ps(d, _mm512_sub_ps(e, eight)));
      odd = round_to_bf16_keep_nan(_mm512_mul_ps(d, _mm512_sub_ps(o, eight)));
      return;
    }
    const __m512 m = _mm512_set1_ps(fp16[load_u16(b + 2)]);
    even = round_to_bf16_keep_nan(_mm512_add_ps(_mm512_mul_ps(d, e), m));
    odd = round_to_bf16_keep_nan(_mm512_add_ps(_mm512_mul_ps(d, o), m));
  }
};

REFIT_TARGET_AVX2 inline __m256 round_to_bf16_8_keep_nan(__m256 v) {
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_ps(round_to_bf16_8(v), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
}

// AVX2: a chunk is half a block (16 elements, h = c % 2): Q4's low nibbles (h 0) or high ones
// (h 1) of the 16 quant bytes, as 8 two-byte lanes; Q8_0's bytes 16 h to 16 h + 15.
struct GgufDecode8 {
  const std::uint8_t* blocks;
  const float* fp16;
  std::int64_t row_bytes, block_bytes;
  GgufBlockType type;
  REFIT_TARGET_AVX2 void operator()(std::int64_t row, std::int64_t c, __m256& even, __m256& odd) const {
    const std::uint8_t* b = blocks + row * row_bytes + (c / 2) * block_bytes;
    const int h = static_cast<int>(c % 2);
    _mm_prefetch(ahead(reinterpret_cast<const std::uint16_t*>(b), kPrefetchRows * row_bytes / 2), _MM_HINT_T0);
    const __m256 d = _mm256_set1_ps(fp16[load_u16(b)]);
    if (type == GgufBlockType::q8_0) {
      const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * h)));
      const __m256 e = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24));
      const __m256 o = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 24));
      even = round_to_bf16_8_keep_nan(_mm256_mul_ps(e, d));
      odd = round_to_bf16_8_keep_nan(_mm256_mul_ps(o, d));
      return;
    }
    const bool q4_1 = type == GgufBlockType::q4_1;
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (q4_1 ? 4 : 2))));
    const __m256i nibble = _mm256_set1_epi32(15);
    const __m256 e = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4 * h), nibble));
    const __m256 o = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8 + 4 * h), nibble));
    if (!q4_1) {
      const __m256 eight = _mm256_set1_ps(8);
      even = round_to_bf16_8_keep_nan(_mm256_mul_ps(d, _mm256_sub_ps(e, eight)));
      odd = round_to_bf16_8_keep_nan(_mm256_mul_ps(d, _mm256_sub_ps(o, eight)));
      return;
    }
    const __m256 m = _mm256_set1_ps(fp16[load_u16(b + 2)]);
    even = round_to_bf16_8_keep_nan(_mm256_add_ps(_mm256_mul_ps(d, e), m));
    odd = round_to_bf16_8_keep_nan(_mm256_add_ps(_mm256_mul_ps(d, o), m));
  }
};

// The block over decoded weights, one per vector width (a macro: each its own target ISA): MB x
// rows (split, V even then V odd per chunk) against NB decoded W rows, the FMA loops' order.
#define REFIT_DECODED_BLOCK(NAME, TARGET, VEC, V, ZERO, LOAD, FMADD, SUM)                                                 \
  template <int MB, int NB, class Decode>                                                                                 \
  TARGET void NAME(const float* xs, std::int64_t chunks, std::int64_t c0, std::int64_t c1, const Decode& decode,          \
                   std::int64_t n, float* y, std::int64_t ldy, bool add) {                                                \
    VEC acc[MB][NB];                                                                                                      \
    _Pragma("GCC unroll 8") for (int i = 0; i < MB; ++i) _Pragma("GCC unroll 2") for (int j = 0; j < NB; ++j) acc[i][j] = \
        ZERO();                                                                                                           \
    for (std::int64_t c = c0; c < c1; ++c) {                                                                              \
      VEC we[NB], wo[NB];                                                                                                 \
      _Pragma("GCC unroll 2") for (int j = 0; j < NB; ++j) decode(n + j, c, we[j], wo[j]);                                \
      _Pragma("GCC unroll 8") for (int i = 0; i < MB; ++i) {                                                              \
        const float* xr = xs + (i * chunks + c) * 2 * V;                                                                  \
        VEC xe = LOAD(xr), xo = LOAD(xr + V);                                                                             \
        __asm__("" : "+v"(xe), "+v"(xo));                                                                                 \
        _Pragma("GCC unroll 2") for (int j = 0; j < NB; ++j) acc[i][j] = FMADD(xo, wo[j], FMADD(xe, we[j], acc[i][j]));   \
      }                                                                                                                   \
    }                                                                                                                     \
    _Pragma("GCC unroll 8") for (int i = 0; i < MB; ++i) _Pragma("GCC unroll 2") for (int j = 0; j < NB; ++j)             \
        y[i * ldy + j] = add ? y[i * ldy + j] + SUM(acc[i][j]) : SUM(acc[i][j]);                                          \
  }
REFIT_DECODED_BLOCK(block_decoded_avx512, REFIT_TARGET_AVX512, __m512, 16, _mm512_setzero_ps, _mm512_loadu_ps,
                    _mm512_fmadd_ps, sum16)
REFIT_DECODED_BLOCK(block_decoded_avx2, REFIT_TARGET_AVX2, __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps,
                    sum8)
#undef REFIT_DECODED_BLOCK

// round_bf16(x · Wᵀ + bias) for a W [N, K] the decoder gives: x split once; the columns between
// threads; rows in blocks of as many as the registers hold beside NB = 2 W rows (even and odd
// halves) and one x vector, 8 x 2 accumulators of AVX-512's 32 registers (V 16), 4 x 2 of AVX2's
// 16 (V 8); K in segments of at most 768 elements, so that the block's x rows (fp32) stay in L1
// while every W row of the columns passes (8 rows of 768: 24 KB), each segment's sums added into
// the results in order. The segments depend on K alone, so a row's result does not depend on M.
// The bias added in fp32, one rounding (as the fp32 route's addmm, then its cast).
template <int V, class Decode>
at::Tensor decoded_mm(const at::Tensor& x, const Decode& decode, std::int64_t N, std::int64_t K, const at::Tensor& bias) {
  constexpr int kRows = V == 16 ? 8 : 4;
  const std::int64_t M = x.size(0), chunks = (K + 2 * V - 1) / (2 * V), lda = M > 1 ? x.stride(0) : K;
  std::vector<float> xs(static_cast<std::size_t>(M * chunks * 2 * V));
  if constexpr (V == 16) split_rows_avx512(static_cast<const std::uint16_t*>(x.const_data_ptr()), lda, M, K, xs.data());
  else
    split_rows_avx2(static_cast<const std::uint16_t*>(x.const_data_ptr()), lda, M, K, xs.data());
  const std::unique_ptr<float[]> y(new float[static_cast<std::size_t>(M * N)]);
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kBFloat16));
  auto* o = static_cast<std::uint16_t*>(out.data_ptr());
  const at::Tensor bias_row = bias.defined() ? bias.to(at::kBFloat16).contiguous() : bias;
  const auto* pb = bias_row.defined() ? static_cast<const std::uint16_t*>(bias_row.const_data_ptr()) : nullptr;
  const std::int64_t max_chunks = 768 / (2 * V), segments = (chunks + max_chunks - 1) / max_chunks;
  // Columns in tasks of blocks of 4 W rows, at least ~8K weights a task (a few rows are too
  // little work to hand a thread).
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 13) / std::max<std::int64_t>(K, 1));
  at::parallel_for(0, (N + 3) / 4, grain, [&](std::int64_t begin, std::int64_t end) {
    const std::int64_t n0 = begin * 4, n1 = std::min(N, end * 4);
    for (std::int64_t s = 0; s < segments; ++s) {
      const std::int64_t c0 = chunks * s / segments, c1 = chunks * (s + 1) / segments;
      for (std::int64_t n = n0; n < n1; n += 2)
        for (std::int64_t m = 0; m < M; m += kRows) {
          const int mb = static_cast<int>(std::min<std::int64_t>(kRows, M - m)), nb = n1 - n >= 2 ? 2 : 1;
          for_block(
              mb, nb,
              [&](auto MB, auto NB) {
                const float* xm = xs.data() + m * chunks * 2 * V;
                float* ym = y.get() + m * N + n;
                if constexpr (V == 16)
                  block_decoded_avx512<decltype(MB)::value, decltype(NB)::value>(xm, chunks, c0, c1, decode, n, ym, N,
                                                                                 s > 0);
                else
                  block_decoded_avx2<decltype(MB)::value, decltype(NB)::value>(xm, chunks, c0, c1, decode, n, ym, N, s > 0);
              },
              std::make_integer_sequence<int, kRows>{});
        }
    }
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = n0; n < n1; ++n) {
        float v = y[m * N + n];
        if (pb) v += c10::detail::f32_from_bits(pb[n]);
        o[m * N + n] = c10::detail::round_to_nearest_even(v);
      }
  });
  return out;
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
  // AVX512-BF16; docs/performance.md, "Decoding"): every loop beats LibTorch's native bf16
  // kernel and the fp32 route on every shape up to 16 rows (the AVX2 loop run there too).
  // REFIT_FEW_ROWS_MAX: another limit, for the benchmark to time more rows.
  static const std::int64_t forced = [] {
    const char* v = std::getenv("REFIT_FEW_ROWS_MAX");
    return v && std::atoll(v) > 0 ? std::min<std::int64_t>(std::atoll(v), 64) : 0;
  }();
  if (isa == FewRowsIsa::none) return 0;
  if (forced) return forced;
  return 16;
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
  const auto* w = static_cast<const std::uint16_t*>(b.const_data_ptr());
  const std::int64_t ldw = N > 1 ? b.stride(1) : K;
  const at::Tensor bias_row = bias.defined() ? (bias.dim() == 2 ? bias.select(0, 0) : bias) : bias;
#if defined(__x86_64__)
  if (isa == FewRowsIsa::avx512) return decoded_mm<16>(a, Bf16Decode{w, ldw, K}, N, K, bias_row);
  if (isa == FewRowsIsa::avx2) return decoded_mm<8>(a, Bf16Decode8{w, ldw, K}, N, K, bias_row);
#endif
  // The fp32 results before their rounding: every element is written by the loops before it is
  // read, so no zeroing (a decoding step's lm_head would clear 1.5 MB per token).
  const std::unique_ptr<float[]> y(new float[static_cast<std::size_t>(M * N)]);
  Problem p{static_cast<const std::uint16_t*>(a.const_data_ptr()),
            w,
            bias_row.defined() ? static_cast<const std::uint16_t*>(bias_row.const_data_ptr()) : nullptr,
            y.get(),
            M,
            K,
            N,
            M > 1 ? a.stride(0) : K,
            ldw,
            bias_row.defined() ? bias_row.stride(0) : 0};
  // VDPBF16PS: columns split between threads in blocks of 4 W rows (8 K bytes each); a few W rows
  // per task are too little work to hand a thread: at least ~64 KB of weight per task.
  const std::int64_t blocks = (N + 3) / 4;
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 13) / std::max<std::int64_t>(K, 1));
  at::Tensor out = at::empty({M, N}, a.options().dtype(at::kBFloat16));
  auto* o = static_cast<std::uint16_t*>(out.data_ptr());
  at::parallel_for(0, blocks, grain, [&](std::int64_t begin, std::int64_t end) {
    const std::int64_t n0 = begin * 4, n1 = std::min(N, end * 4);
#if defined(__x86_64__)
    columns_avx512_bf16(p, n0, n1);
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

namespace {

// The width of the decoding loops for `isa`: AVX-512 for the AVX-512 loops (VDPBF16PS's CPUs
// included), AVX2 for AVX2; none elsewhere or where this CPU does not run it.
FewRowsIsa decoded_isa(FewRowsIsa isa) {
  const FewRowsIsa loop = isa == FewRowsIsa::avx512_bf16 ? FewRowsIsa::avx512 : isa;
  return few_rows_runs_here(loop) ? loop : FewRowsIsa::none;
}

bool decoded_rows_fit(const at::Tensor& x, std::int64_t N, std::int64_t K, FewRowsIsa isa) {
  if (decoded_isa(isa) == FewRowsIsa::none) return false;
  if (x.dim() != 2 || x.scalar_type() != at::kBFloat16 || !x.device().is_cpu() || x.size(1) != K) return false;
  if (x.size(0) < 1 || x.size(0) > few_rows_limit(isa) || (x.stride(1) != 1 && K > 1)) return false;
  return N >= 1 && K >= 32 && K % 32 == 0;
}

}  // namespace

bool few_rows_nf4_fits(const at::Tensor& x, std::int64_t N, std::int64_t K, std::int64_t blocksize, FewRowsIsa isa) {
  return decoded_rows_fit(x, N, K, isa) && blocksize % 32 == 0 && K % blocksize == 0;
}

at::Tensor few_rows_nf4_mm(const at::Tensor& x, const Nf4Rows& w, std::int64_t N, std::int64_t K, const at::Tensor& bias,
                           FewRowsIsa isa) {
  if (!few_rows_nf4_fits(x, N, K, w.blocksize, isa))
    throw Error("few_rows_nf4_mm: operands outside the kernel's cases (bf16 x [M <= 16, K], K and the blocksize "
                "multiples of 32, an AVX-512 or AVX2 loop)");
#if defined(__x86_64__)
  const std::int64_t blocks_per_row = K / w.blocksize, blocks = N * blocks_per_row;
  // Each block's maximum in fp32, double quantization undone as nf4_block_maxima computes it
  // (code * scale, rounded, then + offset, rounded: not one fused operation).
  std::vector<float> maxima(static_cast<std::size_t>(blocks));
  if (w.absmax_f32) {
    std::copy(w.absmax_f32, w.absmax_f32 + blocks, maxima.begin());
  } else {
    const auto& code = refit::quant::dynamic_code();
    for (std::int64_t b = 0; b < blocks; ++b) {
      volatile float scaled = code[w.absmax_u8[b]] * w.absmax_scale[b / w.absmax_blocksize];
      maxima[static_cast<std::size_t>(b)] = scaled + w.offset;
    }
  }
  if (decoded_isa(isa) == FewRowsIsa::avx2)
    return decoded_mm<8>(x, Nf4Decode8{w.packed, maxima.data(), K / 2, blocks_per_row, w.blocksize / 16}, N, K, bias);
  return decoded_mm<16>(x, Nf4Decode{w.packed, maxima.data(), K / 2, blocks_per_row, w.blocksize / 32}, N, K, bias);
#else
  return {};
#endif
}

bool few_rows_gguf_fits(const at::Tensor& x, std::int64_t N, std::int64_t K, FewRowsIsa isa) {
  return decoded_rows_fit(x, N, K, isa);
}

at::Tensor few_rows_gguf_mm(const at::Tensor& x, const std::uint8_t* blocks, GgufBlockType type, std::int64_t N,
                            std::int64_t K, const at::Tensor& bias, FewRowsIsa isa) {
  if (!few_rows_gguf_fits(x, N, K, isa))
    throw Error("few_rows_gguf_mm: operands outside the kernel's cases (bf16 x [M <= 16, K], K a multiple of 32, "
                "an AVX-512 or AVX2 loop)");
#if defined(__x86_64__)
  const std::int64_t block_bytes = type == GgufBlockType::q8_0 ? 34 : type == GgufBlockType::q4_1 ? 20 : 18;
  const std::int64_t row_bytes = K / 32 * block_bytes;
  if (decoded_isa(isa) == FewRowsIsa::avx2)
    return decoded_mm<8>(x, GgufDecode8{blocks, fp16_to_float_table(), row_bytes, block_bytes, type}, N, K, bias);
  return decoded_mm<16>(x, GgufDecode{blocks, fp16_to_float_table(), row_bytes, block_bytes, type}, N, K, bias);
#else
  return {};
#endif
}

bool few_rows_int8_fits(const at::Tensor& x, std::int64_t N, std::int64_t K, FewRowsIsa isa) {
  return decoded_rows_fit(x, N, K, isa);
}

at::Tensor few_rows_int8_mm(const at::Tensor& x, const std::int8_t* weight, const float* scale, std::int64_t N,
                            std::int64_t K, const at::Tensor& bias, FewRowsIsa isa) {
  if (!few_rows_int8_fits(x, N, K, isa))
    throw Error("few_rows_int8_mm: operands outside the kernel's cases (bf16 x [M <= 16, K], K a multiple of 32, "
                "an AVX-512 or AVX2 loop)");
#if defined(__x86_64__)
  if (decoded_isa(isa) == FewRowsIsa::avx2) return decoded_mm<8>(x, Int8Decode8{weight, scale, K}, N, K, bias);
  return decoded_mm<16>(x, Int8Decode{weight, scale, K}, N, K, bias);
#else
  return {};
#endif
}

}  // namespace refit::precision

// Unity batches put other units after this one.
#undef REFIT_TARGET_AVX512BF16
#undef REFIT_TARGET_AVX512
#undef REFIT_TARGET_AVX2
