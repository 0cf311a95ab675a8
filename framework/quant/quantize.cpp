#include "quant/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "refit/error.h"

namespace refit::quant {

namespace {

void check_finite(const torch::Tensor& w, const char* format) {
  if (!at::isfinite(w).all().item<bool>())
    throw Error(std::string(format) + ": the weight holds a NaN or an infinite value; it cannot be quantized");
}

/// bitsandbytes' native quantize_blockwise (csrc/cpu_ops.cpp, quantize_cpu_impl) on `n` floats:
/// per block the maximum of |x|; a zero block is all index 0; otherwise each value times the
/// reciprocal of the maximum, clamped to [-1, 1], is mapped to one of 65,536 grid points
/// (truncating (v + 1) * 0.5 * 65535 + 0.5) and the grid point to its code through a table built
/// once: the first code whose midpoint with the next is not below the grid value. The grid, not
/// the value itself, decides: a value within ~1.5e-5 of a midpoint may take the farther code, as
/// bitsandbytes' does.
void quantize_blockwise(const float* x, std::int64_t n, std::int64_t blocksize, std::uint8_t* out, float* absmax) {
  constexpr int kGrid = 65536;
  static const std::vector<std::uint8_t> table = [] {
    const auto& code = dynamic_code();
    std::array<float, 255> mid{};
    for (std::size_t i = 0; i < mid.size(); ++i) mid[i] = 0.5f * (code[i] + code[i + 1]);
    std::vector<std::uint8_t> t(kGrid);
    std::size_t c = 0;
    for (int i = 0; i < kGrid; ++i) {
      const float v = -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kGrid - 1);
      while (c < mid.size() && mid[c] < v) ++c;
      t[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(c);
    }
    return t;
  }();
  for (std::int64_t start = 0, b = 0; start < n; start += blocksize, ++b) {
    const std::int64_t end = std::min(n, start + blocksize);
    float m = 0.0f;
    for (std::int64_t i = start; i < end; ++i) m = std::max(m, std::fabs(x[i]));
    absmax[b] = m;
    if (m == 0.0f) {
      std::fill(out + start, out + end, std::uint8_t{0});
      continue;
    }
    const float reciprocal = 1.0f / m;
    for (std::int64_t i = start; i < end; ++i) {
      const float v = std::clamp(x[i] * reciprocal, -1.0f, 1.0f);
      const auto k = static_cast<std::uint16_t>((v + 1.0f) * 0.5f * static_cast<float>(kGrid - 1) + 0.5f);
      out[i] = table[k];
    }
  }
}

}  // namespace

Nf4Weight quantize_nf4(const torch::Tensor& weight, const Nf4Options& o) {
  const std::int64_t bs = o.blocksize;
  if (bs < 16 || bs > 4096 || (bs & (bs - 1)) != 0)
    throw Error("nf4: blocksize must be a power of two in [16, 4096], got " + std::to_string(bs));
  if (o.double_quantization && (o.absmax_blocksize < 16 || (o.absmax_blocksize & (o.absmax_blocksize - 1)) != 0))
    throw Error("nf4: the block maxima's blocksize must be a power of two >= 16, got " + std::to_string(o.absmax_blocksize));
  const torch::Tensor w = weight.detach().to(torch::kCPU, torch::kFloat).contiguous().reshape(-1);
  if (w.numel() == 0) throw Error("nf4: cannot quantize an empty weight");
  check_finite(w, "nf4");
  const std::int64_t n = w.numel(), blocks = (n + bs - 1) / bs;
  const float* x = w.data_ptr<float>();

  // The code's midpoints, (c[i] + c[i + 1]) / 2 in float32, as torch.bucketize receives them.
  const auto& code = nf4_code();
  std::array<float, 15> mid{};
  for (std::size_t i = 0; i < mid.size(); ++i) mid[i] = (code[i] + code[i + 1]) / 2.0f;

  Nf4Weight q;
  q.shape = weight.sizes().vec();
  q.blocksize = bs;
  q.absmax_blocksize = o.absmax_blocksize;
  torch::Tensor absmax = torch::empty({blocks}, torch::kFloat);
  q.packed = torch::empty({(n + 1) / 2}, torch::kUInt8);
  float* am = absmax.data_ptr<float>();
  std::uint8_t* packed = q.packed.data_ptr<std::uint8_t>();
  // Blocks in parallel: a block's length is even (a power of two), so no two blocks share a byte
  // but the last, odd-length one's final byte, which no other block writes either.
  at::parallel_for(0, blocks, std::max<std::int64_t>(1, 16384 / bs), [&](std::int64_t first, std::int64_t last) {
    std::vector<std::uint8_t> index(static_cast<std::size_t>(bs));
    for (std::int64_t b = first; b < last; ++b) {
      const std::int64_t start = b * bs, end = std::min(n, start + bs), len = end - start;
      const float* xb = x + start;
      float m = 0;
      for (std::int64_t i = 0; i < len; ++i) m = std::max(m, std::fabs(xb[i]));
      am[b] = m;
      const bool full = len == bs;
      // A full block is multiplied by the reciprocal of its maximum (clamped to 1e-38: a zero
      // block gives zeros); the short last block is divided by it, as bitsandbytes' default
      // kernel does.
      const float clamped = std::max(m, 1e-38f), reciprocal = 1.0f / clamped;
      std::uint8_t* ix = index.data();
      // bucketize (right=False): the count of midpoints strictly below the value, counted
      // without branches (15 comparisons the compiler vectorises) rather than binary-searched.
      const auto code_of = [&mid](float scaled) {
        std::uint8_t k = 0;
        for (std::size_t j = 0; j < mid.size(); ++j) k += mid[j] < scaled;
        return k;
      };
      if (full)
        for (std::int64_t i = 0; i < len; ++i) ix[i] = code_of(std::clamp(xb[i] * reciprocal, -1.0f, 1.0f));
      else
        for (std::int64_t i = 0; i < len; ++i) ix[i] = code_of(std::clamp(xb[i] / clamped, -1.0f, 1.0f));
      // Two codes a byte, the first in the high nibble; an odd last value's low nibble is the
      // pad (below).
      std::uint8_t* out = packed + start / 2;
      for (std::int64_t i = 0; i + 1 < len; i += 2) out[i / 2] = static_cast<std::uint8_t>(ix[i] << 4 | ix[i + 1]);
      if (len % 2 == 1) out[len / 2] = static_cast<std::uint8_t>(ix[len - 1] << 4);
    }
  });
  if (n % 2 == 1) packed[n / 2] |= 7;  // the pad value 0.0 is code 7, in the low nibble

  if (!o.double_quantization) {
    q.absmax = absmax;
    return q;
  }
  // Double quantization: the block maxima less their mean (torch's float32 mean, as
  // bitsandbytes computes it) in 8 bits, blocks of absmax_blocksize.
  q.offset = absmax.mean().item<float>();
  const torch::Tensor centred = (absmax - q.offset).contiguous();
  const std::int64_t outer = (blocks + o.absmax_blocksize - 1) / o.absmax_blocksize;
  q.absmax = torch::empty({blocks}, torch::kUInt8);
  q.absmax_scale = torch::empty({outer}, torch::kFloat);
  quantize_blockwise(centred.data_ptr<float>(), blocks, o.absmax_blocksize, q.absmax.data_ptr<std::uint8_t>(),
                     q.absmax_scale.data_ptr<float>());
  return q;
}

Int8Weight quantize_int8(const torch::Tensor& weight) {
  if (weight.dim() != 2 || weight.numel() == 0)
    throw Error("int8: expected a non-empty 2-d weight [rows, cols], got " + c10::str(weight.sizes()));
  const torch::Tensor w = weight.detach().to(torch::kCPU, torch::kFloat).contiguous();
  check_finite(w, "int8");
  Int8Weight q;
  // bitsandbytes' int8_vectorwise_quant: round(w * (127 / row max)), ties to even; a zero row
  // (0 / 0) is refused rather than stored as NaN.
  q.scale = std::get<0>(w.abs().max(1));
  if ((q.scale == 0).any().item<bool>()) throw Error("int8: a row of the weight is all zeros (its scale would be 0)");
  // 127 / max as Python computes `127.0 / tensor`: the reciprocal times 127 (C++'s Scalar /
  // Tensor divides, which moves a product landing on .5 by an ulp, and its rounding with it).
  q.weight = at::round(w * (q.scale.reciprocal() * 127.0).unsqueeze(-1)).to(torch::kChar);
  return q;
}

}  // namespace refit::quant
