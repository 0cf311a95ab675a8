#include "text/dropout.h"

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

namespace refit::text {

void philox4x32_10(const std::uint32_t counter[4], const std::uint32_t key[2], std::uint32_t out[4]) {
  std::uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  std::uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * c0;
    const std::uint64_t p1 = std::uint64_t{0xCD9E8D57u} * c2;
    const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<std::uint32_t>(p1);
    c3 = static_cast<std::uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

namespace {

std::uint64_t seed_from_default_generator() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

}  // namespace

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  if (p >= 1) return x * 0;
  if (!x.device().is_cpu()) return at::dropout(x, p, true);
  const std::uint64_t seed = seed_from_default_generator();
  const std::uint32_t key[2] = {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  // Kept where the 32-bit word is below (1 - p)·2^32.
  const double keep = 1.0 - p;
  const std::uint64_t threshold = static_cast<std::uint64_t>(std::ldexp(keep, 32));
  torch::Tensor noise = at::empty(x.sizes(), x.options().requires_grad(false));
  const std::int64_t n = noise.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, noise.scalar_type(), "refit_text_dropout", [&] {
    scalar_t* out = noise.data_ptr<scalar_t>();
    const scalar_t scale = static_cast<scalar_t>(1.0 / keep);
    const scalar_t zero = static_cast<scalar_t>(0);
    const std::int64_t blocks = (n + 3) / 4;
    at::parallel_for(0, blocks, 2048, [&](std::int64_t begin, std::int64_t end) {
      std::uint32_t words[4];
      for (std::int64_t b = begin; b < end; ++b) {
        const std::uint32_t counter[4] = {static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32), 0, 0};
        philox4x32_10(counter, key, words);
        const std::int64_t base = b * 4;
        const int count = static_cast<int>(std::min<std::int64_t>(4, n - base));
        for (int i = 0; i < count; ++i) out[base + i] = words[i] < threshold ? scale : zero;
      }
    });
  });
  return x * noise;
}

}  // namespace refit::text
