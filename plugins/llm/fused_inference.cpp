#include "fused_inference.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

namespace refit::llm {

namespace {

// A value widened to fp32, and an fp32 result rounded to the element type (nearest even).
inline float wide(float x) { return x; }
inline float wide(c10::BFloat16 x) { return static_cast<float>(x); }
template <class T>
inline T narrow(float x) {
  return static_cast<T>(x);
}

bool float_or_bf16(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16;
}

// No contraction of a product into the following add: the composite rounds the product first.
template <class T>
__attribute__((optimize("fp-contract=off"))) void norm_rows(const T* x, const T* w, T* out, std::int64_t rows,
                                                            std::int64_t D, float eps) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * D;
    T* o = out + r * D;
    float ss = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      const float v = wide(xr[d]);
      ss += v * v;
    }
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
    // h = round(x * scale) to T, then weight * h rounded to T (two operations, as composed).
    for (std::int64_t d = 0; d < D; ++d) o[d] = narrow<T>(wide(w[d]) * wide(narrow<T>(wide(xr[d]) * scale)));
  }
}

template <class T>
__attribute__((optimize("fp-contract=off"))) void rotate_row(const T* x, const T* c, const T* s, T* o, std::int64_t D) {
  const std::int64_t half = D / 2;
  for (std::int64_t d = 0; d < D; ++d) {
    const float turned = d < half ? -wide(x[d + half]) : wide(x[d - half]);
    const T a = narrow<T>(wide(x[d]) * wide(c[d]));  // x * cos
    const T b = narrow<T>(turned * wide(s[d]));      // rotate_half(x) * sin
    o[d] = narrow<T>(wide(a) + wide(b));
  }
}

}  // namespace

bool rms_norm_inference_fits(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0) && x.scalar_type() == weight.scalar_type() &&
         float_or_bf16(x) && x.device().is_cpu() && weight.device().is_cpu() && x.is_contiguous() && weight.is_contiguous();
}

torch::Tensor rms_norm_inference(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(rms_norm_inference_fits(x, weight), "rms_norm_inference: operands outside its cases");
  torch::Tensor out = torch::empty_like(x, c10::MemoryFormat::Contiguous);
  const std::int64_t D = x.size(-1), rows = D ? x.numel() / D : 0;
  // Rows in tasks of ~16K elements (a decoding step's few rows stay on the calling thread).
  at::parallel_for(0, rows, std::max<std::int64_t>(1, (std::int64_t{1} << 14) / std::max<std::int64_t>(D, 1)),
                   [&](std::int64_t r0, std::int64_t r1) {
                     const auto e = static_cast<float>(eps);
                     if (x.scalar_type() == torch::kFloat)
                       norm_rows(x.const_data_ptr<float>() + r0 * D, weight.const_data_ptr<float>(),
                                 out.data_ptr<float>() + r0 * D, r1 - r0, D, e);
                     else
                       norm_rows(x.const_data_ptr<c10::BFloat16>() + r0 * D, weight.const_data_ptr<c10::BFloat16>(),
                                 out.data_ptr<c10::BFloat16>() + r0 * D, r1 - r0, D, e);
                   });
  return out;
}

bool rotate_inference_fits(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (x.dim() != 4 || cos.dim() != 4 || sin.dim() != 4 || !float_or_bf16(x)) return false;
  if (cos.scalar_type() != x.scalar_type() || sin.scalar_type() != x.scalar_type()) return false;
  if (!x.device().is_cpu() || !cos.device().is_cpu() || !sin.device().is_cpu()) return false;
  const std::int64_t B = x.size(0), T = x.size(2), D = x.size(3);
  if (D % 2 != 0 || x.stride(3) != 1 || cos.stride(3) != 1 || sin.stride(3) != 1) return false;
  const std::vector<std::int64_t> table{B, 1, T, D};
  return cos.sizes() == torch::IntArrayRef(table) && sin.sizes() == torch::IntArrayRef(table);
}

torch::Tensor rotate_inference(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(rotate_inference_fits(x, cos, sin), "rotate_inference: operands outside its cases");
  const std::int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  torch::Tensor out = torch::empty({B, H, T, D}, x.options().memory_format(c10::MemoryFormat::Contiguous));
  at::parallel_for(0, B * H * T, std::max<std::int64_t>(1, (std::int64_t{1} << 14) / D),
                   [&](std::int64_t i0, std::int64_t i1) {
                     for (std::int64_t i = i0; i < i1; ++i) {
                       const std::int64_t b = i / (H * T), h = i / T % H, t = i % T;
                       const std::int64_t xo = b * x.stride(0) + h * x.stride(1) + t * x.stride(2);
                       const std::int64_t co = b * cos.stride(0) + t * cos.stride(2);
                       const std::int64_t so = b * sin.stride(0) + t * sin.stride(2);
                       if (x.scalar_type() == torch::kFloat)
                         rotate_row(x.const_data_ptr<float>() + xo, cos.const_data_ptr<float>() + co,
                                    sin.const_data_ptr<float>() + so, out.data_ptr<float>() + i * D, D);
                       else
                         rotate_row(x.const_data_ptr<c10::BFloat16>() + xo, cos.const_data_ptr<c10::BFloat16>() + co,
                                    sin.const_data_ptr<c10::BFloat16>() + so, out.data_ptr<c10::BFloat16>() + i * D, D);
                     }
                   });
  return out;
}

}  // namespace refit::llm
