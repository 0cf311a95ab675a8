#include "quant/dequantize_cpu.h"

#include <array>

#include <ATen/Parallel.h>

namespace refit::quant {

namespace {

bool fast_path(const torch::Tensor& t, c10::ScalarType dtype) {
  return t.device().is_cpu() && (dtype == c10::kFloat || dtype == c10::kBFloat16);
}

/// out[i] = code[nibble i] * maxima[i / blocksize], nibbles high first, for i in [begin, end).
template <class T>
void nf4_range(const std::uint8_t* packed, const float* maxima, std::int64_t blocksize, std::int64_t begin, std::int64_t end,
               T* out) {
  const auto& code = nf4_code();
  std::int64_t i = begin;
  while (i < end) {
    const float m = maxima[i / blocksize];
    const std::int64_t stop = std::min(end, (i / blocksize + 1) * blocksize);
    if (i % 2 == 1 && i < stop) {  // a block that starts on a low nibble (an odd blocksize)
      out[i] = static_cast<T>(code[packed[i / 2] & 15] * m);
      ++i;
    }
    for (; i + 1 < stop; i += 2) {
      const std::uint8_t b = packed[i / 2];
      out[i] = static_cast<T>(code[b >> 4] * m);
      out[i + 1] = static_cast<T>(code[b & 15] * m);
    }
    if (i < stop) {  // a block that ends on a high nibble
      out[i] = static_cast<T>(code[packed[i / 2] >> 4] * m);
      ++i;
    }
  }
}

}  // namespace

torch::Tensor dequantize_nf4_fast(const Nf4Weight& q, c10::ScalarType dtype) {
  if (!fast_path(q.packed, dtype)) return dequantize_nf4(q, dtype);
  const torch::Tensor maxima = nf4_block_maxima(q).to(torch::kFloat).contiguous();
  const torch::Tensor packed = q.packed.contiguous();
  const std::int64_t n = q.numel();
  torch::Tensor out = torch::empty({n}, torch::TensorOptions().dtype(dtype));
  const auto* p = packed.data_ptr<std::uint8_t>();
  const float* m = maxima.data_ptr<float>();
  const std::int64_t bs = q.blocksize;
  // Chunks of whole blocks (and an even start: a byte is never split between two threads' work).
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / bs) * bs * 2;
  at::parallel_for(0, (n + grain - 1) / grain, 1, [&](std::int64_t c0, std::int64_t c1) {
    const std::int64_t begin = c0 * grain, end = std::min(n, c1 * grain);
    if (dtype == c10::kFloat) nf4_range(p, m, bs, begin, end, out.data_ptr<float>());
    else
      nf4_range(p, m, bs, begin, end, out.data_ptr<c10::BFloat16>());
  });
  return out.view(q.shape);
}

torch::Tensor dequantize_int8_fast(const Int8Weight& q, c10::ScalarType dtype) {
  if (!fast_path(q.weight, dtype) || q.weight.dim() != 2) return dequantize_int8(q, dtype);
  const torch::Tensor w = q.weight.contiguous(), scale = q.scale.to(torch::kFloat).contiguous();
  const std::int64_t rows = w.size(0), cols = w.size(1);
  torch::Tensor out = torch::empty({rows, cols}, torch::TensorOptions().dtype(dtype));
  const auto* pw = w.data_ptr<std::int8_t>();
  const float* ps = scale.data_ptr<float>();
  // The portable path's two float32 products in its order: (w * scale) * float(1/127).
  const float inv127 = static_cast<float>(7.874015718698502e-3);
  auto rows_of = [&](auto* o, std::int64_t r0, std::int64_t r1) {
    using T = std::remove_pointer_t<decltype(o)>;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float s = ps[r];
      for (std::int64_t c = 0; c < cols; ++c) {
        const float v = static_cast<float>(pw[r * cols + c]) * s;
        o[r * cols + c] = static_cast<T>(v * inv127);
      }
    }
  };
  at::parallel_for(0, rows, std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, cols)),
                   [&](std::int64_t r0, std::int64_t r1) {
                     if (dtype == c10::kFloat) rows_of(out.data_ptr<float>(), r0, r1);
                     else
                       rows_of(out.data_ptr<c10::BFloat16>(), r0, r1);
                   });
  return out;
}

}  // namespace refit::quant
