#include "cpu_small_mm.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <c10/util/BFloat16.h>

namespace refit::lora {
namespace {

using c10::BFloat16;

// Thread-local scratch: the packed operands and the fp32 accumulator (the autograd engine may
// run a backward on another thread than the forward).
struct Scratch {
  std::vector<std::uint16_t> a, b;
  std::vector<float> c;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// fp32 -> bf16 bits: c10's own round-to-nearest-even, as c10::BFloat16(float) (NaN -> 0x7FC0;
// ATen's vectorised cast may keep other NaN payload bits).
inline std::uint16_t to_bf16_bits(float f) { return c10::detail::round_to_nearest_even(f); }

// The loops below run only where small_mm_bf16_available() found AVX512-BF16 (which implies these).
#if defined(__x86_64__)
#define REFIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#else
#define REFIT_AVX512
#endif

// Element loads as bf16 bits: a bf16 operand as it is, an fp32 one rounded as `.to(kBFloat16)`
// rounds it (so a cast that autocast would make is folded into the packing).
inline std::uint16_t bits(std::uint16_t v) { return v; }
inline std::uint16_t bits(float v) { return to_bf16_bits(v); }

// A view of a 2-D operand (bf16 as raw 16-bit words, or fp32) with element strides.
template <class T>
struct Operand {
  const T* p;
  std::int64_t rows, cols, rs, cs;
  std::uint16_t at(std::int64_t r, std::int64_t c) const { return bits(p[r * rs + c * cs]); }
  Operand t() const { return {p, cols, rows, cs, rs}; }
};
template <class T>
Operand<T> operand(const torch::Tensor& x) {
  const void* p = x.const_data_ptr();
  return {static_cast<const T*>(p), x.size(0), x.size(1), x.stride(0), x.stride(1)};
}

// Row-major [M, K2] bf16 copy of A (K2 = K rounded up to even, the pad column zero), or A itself.
template <class T>
REFIT_AVX512 const std::uint16_t* row_major(const Operand<T>& a, std::int64_t K2, std::vector<std::uint16_t>& buf,
                                            std::int64_t& lda) {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    if (a.cs == 1 && K2 == a.cols && a.rows > 1) {
      lda = a.rs;
      return a.p;
    }
  }
  buf.assign(static_cast<std::size_t>(a.rows * K2), 0);
  for (std::int64_t m = 0; m < a.rows; ++m)
    for (std::int64_t k = 0; k < a.cols; ++k) buf[static_cast<std::size_t>(m * K2 + k)] = a.at(m, k);
  lda = K2;
  return buf.data();
}

// B [K, N] in the microkernel's VNNI layout: rows k and k + 1 interleaved, (k, n) at
// (k / 2) * 2N + 2n + k % 2, an odd K padded with a zero row.
template <class T>
REFIT_AVX512 void pack_vnni(const Operand<T>& b, std::int64_t K2, std::vector<std::uint16_t>& buf) {
  const std::int64_t K = b.rows, N = b.cols;
  buf.resize(static_cast<std::size_t>(K2 * N));
  auto* out = reinterpret_cast<std::uint32_t*>(buf.data());
  if (b.cs == 1) {  // rows contiguous: interleave two rows at a time
    for (std::int64_t k = 0; k < K2; k += 2) {
      const T* r0 = b.p + k * b.rs;
      const T* r1 = k + 1 < K ? r0 + b.rs : nullptr;
      std::uint32_t* dst = out + (k / 2) * N;
      if (r1)
        for (std::int64_t n = 0; n < N; ++n) dst[n] = std::uint32_t{bits(r0[n])} | (std::uint32_t{bits(r1[n])} << 16);
      else
        for (std::int64_t n = 0; n < N; ++n) dst[n] = std::uint32_t{bits(r0[n])};
    }
  } else if (b.rs == 1) {  // a transposed view: each pair (k, k + 1) of a column is adjacent
    for (std::int64_t n = 0; n < N; ++n) {
      const T* col = b.p + n * b.cs;
      for (std::int64_t k = 0; k + 1 < K; k += 2)
        out[(k / 2) * N + n] = std::uint32_t{bits(col[k])} | (std::uint32_t{bits(col[k + 1])} << 16);
      if (K & 1) out[(K / 2) * N + n] = std::uint32_t{bits(col[K - 1])};
    }
  } else {
    for (std::int64_t k = 0; k < K2; k += 2)
      for (std::int64_t n = 0; n < N; ++n)
        out[(k / 2) * N + n] = std::uint32_t{b.at(k, n)} | (k + 1 < K ? std::uint32_t{b.at(k + 1, n)} << 16 : 0u);
  }
}

// The fp32 accumulator rounded to bf16, stored as bf16 or widened back to fp32 (`.to(kFloat)`
// of the bf16 result); `transposed`: c holds C^T [N, M].
template <class O>
REFIT_AVX512 void store(const float* c, std::int64_t m, std::int64_t n, bool transposed, O* out) {
  auto put = [](std::uint16_t b) {
    if constexpr (std::is_same_v<O, float>) {
      return c10::detail::f32_from_bits(b);
    } else {
      return b;
    }
  };
  if (!transposed) {
    for (std::int64_t i = 0; i < m * n; ++i) out[i] = put(to_bf16_bits(c[i]));
  } else {
    for (std::int64_t j = 0; j < m; ++j)
      for (std::int64_t i = 0; i < n; ++i) out[i * m + j] = put(to_bf16_bits(c[j * n + i]));
  }
}

template <class TA, class TB>
REFIT_AVX512 void compute_into(const torch::Tensor& a_t, bool ta, const torch::Tensor& b_t, bool tb,
                               const torch::Tensor& out) {
  auto a = operand<TA>(a_t);
  auto b = operand<TB>(b_t);
  if (ta) a = a.t();
  if (tb) b = b.t();
  const std::int64_t M = a.rows, K = a.cols, N = b.cols;
  // The kernel reads A row by row and B packed. C = A B or, transposed, C^T = B^T A^T: whichever
  // needs less copying (a transposed A, e.g. grad^T in d weight = grad^T x, would be copied
  // element by element; its transpose is packed from contiguous rows instead). Writing C back
  // transposed costs too.
  auto cost = [](bool lhs_in_place, std::int64_t lhs_n, std::int64_t rhs_n) {
    return (lhs_in_place ? 0 : 2 * lhs_n) + rhs_n;
  };
  const bool a_in_place = a.cs == 1 && std::is_same_v<TA, std::uint16_t>;
  const bool bt_in_place = b.rs == 1 && std::is_same_v<TB, std::uint16_t>;
  const bool transposed = cost(bt_in_place, K * N, M * K) + 2 * M * N < cost(a_in_place, M * K, K * N);
  const std::int64_t K2 = K + (K & 1);
  Scratch& s = scratch();
  std::int64_t lda = 0, m = M, n = N;
  const std::uint16_t* pa;
  if (!transposed) {
    pa = row_major(a, K2, s.a, lda);
    pack_vnni(b, K2, s.b);
  } else {
    pa = row_major(b.t(), K2, s.a, lda);
    pack_vnni(a.t(), K2, s.b);
    m = N, n = M;
  }
  s.c.resize(static_cast<std::size_t>(m * n));
  at::native::cpublas::brgemm(m, n, K2, lda, n, n, /*add_C=*/false, reinterpret_cast<const BFloat16*>(pa),
                              reinterpret_cast<const BFloat16*>(s.b.data()), s.c.data(), /*is_vnni=*/true);
  if (out.scalar_type() == torch::kFloat) store(s.c.data(), m, n, transposed, out.mutable_data_ptr<float>());
  else
    store(s.c.data(), m, n, transposed, reinterpret_cast<std::uint16_t*>(out.mutable_data_ptr<BFloat16>()));
}

// a (or a^T when ta) times b (or b^T when tb): transposing here costs nothing, a .t() view
// costs a dispatch.
torch::Tensor compute(const torch::Tensor& a, const torch::Tensor& b, c10::ScalarType out_dtype = torch::kBFloat16,
                      bool ta = false, bool tb = false) {
  const std::int64_t M = a.size(ta ? 1 : 0), K = a.size(ta ? 0 : 1), N = b.size(tb ? 0 : 1);
  auto out = torch::empty({M, N}, a.options().dtype(out_dtype).memory_format(c10::MemoryFormat::Contiguous));
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  const bool a32 = a.scalar_type() == torch::kFloat, b32 = b.scalar_type() == torch::kFloat;
  if (a32 && b32) compute_into<float, float>(a, ta, b, tb, out);
  else if (a32)
    compute_into<float, std::uint16_t>(a, ta, b, tb, out);
  else if (b32)
    compute_into<std::uint16_t, float>(a, ta, b, tb, out);
  else
    compute_into<std::uint16_t, std::uint16_t>(a, ta, b, tb, out);
  return out;
}

// LibTorch's own CPU kernel, called directly: the one this path must equal. at::mm itself may
// reach refit's per-shape route (precision/bf16_products.h), which computes in fp32.
torch::Tensor native_mm(const torch::Tensor& a, const torch::Tensor& b) { return at::cpu::mm(a, b); }

bool check_against_aten() {
  // Odd K, a transposed A, and B with contiguous rows, transposed and strided: every packing
  // branch, each compared with at::mm bit for bit; then fp32 operands (rounded as packed) and an
  // fp32 result (the bf16 one widened), as the LoRA layer uses them.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto f32 = [&](at::IntArrayRef shape) { return at::randn(shape, gen, torch::kFloat); };
  auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  auto a = bf16(f32({37, 24})).t();  // [24, 37]
  for (const auto& b : {bf16(f32({37, 40})), bf16(f32({40, 37})).t(), bf16(f32({37, 80})).slice(1, 0, 80, 2)})
    if (!at::equal(compute(a, b), native_mm(a, b))) return false;
  // A row-major A with B^T in place: the transposed product packs A^T from a column view, odd K.
  const auto ar = bf16(f32({4, 37})), bt = bf16(f32({64, 37})).t();
  if (!at::equal(compute(ar, bt), native_mm(ar, bt))) return false;
  auto x = f32({24, 38}), w = f32({16, 38}), v = f32({38, 80}).slice(1, 0, 80, 2);
  return at::equal(compute(bf16(x), w.t()), native_mm(bf16(x), bf16(w).t())) &&
         at::equal(compute(x, v, torch::kFloat), native_mm(bf16(x), bf16(v)).to(torch::kFloat)) &&
         at::equal(compute(w, x.t(), torch::kFloat), native_mm(bf16(w), bf16(x).t()).to(torch::kFloat));
}

}  // namespace

namespace {
/// Whether oneDNN may use AVX512-BF16: ONEDNN_MAX_CPU_ISA below it (the portable tests set AVX2
/// to see an AVX2-only CPU) leaves it no bf16 microkernel to build, and brgemm throws.
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
}  // namespace

bool small_mm_bf16_supported() {
#if defined(__x86_64__) && defined(CPUBLAS_BRGEMM_BF16BF16F32)
  return __builtin_cpu_supports("avx512bf16") && onednn_allows_bf16() &&
         !at::native::cpublas::could_pack(torch::kBFloat16);  // AMX: another layout
#else
  return false;
#endif
}

bool small_mm_bf16_available() {
  static const bool available = [] {
    if (const char* off = std::getenv("REFIT_LORA_SMALL_MM"); off && std::string(off) == "0") return false;
    if (!small_mm_bf16_supported()) return false;
    try {
      return check_against_aten();
    } catch (const std::exception&) {
      return false;
    }
  }();
  return available;
}

bool small_mm_bf16_fits(std::int64_t m, std::int64_t k, std::int64_t n) {
  // One thread at ~150 GFLOP/s vs at::mm's ~15 us of fixed cost on two: below ~1 M multiply-adds
  // the microkernel wins (64 x 512 x 16, the MLP benchmark's LoRA products, is 0.5 M).
  return m * k * n <= (std::int64_t{1} << 20);
}

bool small_mm_bf16_admit(std::int64_t rows) {
  // ATen compiles and keeps one microkernel per shape (M, N, K and leading dimensions), for the
  // life of the process; the row count is in two of them. A fixed batch has one or two row
  // counts, variable-length inputs could have hundreds: the first kMaxRowCounts get the path,
  // the others keep at::mm.
  constexpr std::size_t kMaxRowCounts = 64;
  static std::mutex mutex;
  static std::set<std::int64_t> admitted;
  std::lock_guard<std::mutex> lock(mutex);
  if (admitted.count(rows)) return true;
  if (admitted.size() >= kMaxRowCounts) return false;
  admitted.insert(rows);
  return true;
}

namespace {
std::atomic<std::uint64_t> calls{0};
}  // namespace

std::uint64_t small_mm_bf16_calls() { return calls.load(std::memory_order_relaxed); }

torch::Tensor small_mm_bf16(const torch::Tensor& a, const torch::Tensor& b, c10::ScalarType out_dtype, bool transpose_a,
                            bool transpose_b) {
  calls.fetch_add(1, std::memory_order_relaxed);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(transpose_a ? 0 : 1) == b.size(transpose_b ? 1 : 0),
              "small_mm_bf16: shapes ", a.sizes(), transpose_a ? "^T" : "", " x ", b.sizes(), transpose_b ? "^T" : "");
  auto ok = [](const torch::Tensor& t) {
    return t.is_cpu() && (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kFloat);
  };
  TORCH_CHECK(ok(a) && ok(b) && (out_dtype == torch::kBFloat16 || out_dtype == torch::kFloat),
              "small_mm_bf16: bf16 or fp32 CPU operands, a bf16 or fp32 result");
  TORCH_CHECK(small_mm_bf16_supported(), "small_mm_bf16: the microkernel cannot run on this CPU (small_mm_bf16_supported)");
  return compute(a, b, out_dtype, transpose_a, transpose_b);
}

}  // namespace refit::lora
