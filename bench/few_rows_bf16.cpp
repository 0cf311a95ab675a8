// Few-row bf16 products (precision/few_rows_bf16.h) against LibTorch's native bf16 kernel and the
// fp32 route (widen, fp32 mm, round) on decoding shapes, the weights cycled so that none is in
// cache (as a model's decoding step reads them): time per product and weight bytes per second,
// per row count and vector loop. Chooses few_rows_limit(); docs/performance.md, "Decoding".
//
//   REFIT_FEW_ROWS_MAX=32 build/bench/bench_few_rows_bf16 [K N ...]     (default: SmolLM2-135M's
//   shapes; REFIT_FEW_ROWS_MAX lets the kernel take more rows than refit gives it, to time them)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ops/mm_cpu_dispatch.h>

#include "precision/few_rows_bf16.h"

using namespace refit::precision;

namespace {

template <class F>
double seconds_per_call(F&& f, int calls) {
  f(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f(i);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes{{576, 1536}, {1536, 576}, {576, 576}, {576, 192}, {576, 49152}};
  if (argc > 2) {
    shapes.clear();
    for (int i = 1; i + 1 < argc; i += 2) shapes.emplace_back(std::atoll(argv[i]), std::atoll(argv[i + 1]));
  }
  std::vector<FewRowsIsa> isas;
  for (auto isa : {FewRowsIsa::avx2, FewRowsIsa::avx512, FewRowsIsa::avx512_bf16})
    if (static_cast<int>(isa) <= static_cast<int>(few_rows_isa())) isas.push_back(isa);
  std::printf("threads %d, kernel's loop here: %s\n", at::get_num_threads(), isa_name(few_rows_isa()).c_str());
  std::printf("%6s %6s %3s  %10s %10s", "K", "N", "M", "native", "fp32 route");
  for (auto isa : isas) std::printf(" %12s", isa_name(isa).c_str());
  std::printf("   (us per product; GB/s of weight)\n");
  for (auto [K, N] : shapes) {
    // ~256 MB of weights in all, at least 4 of them, cycled: each call reads its weight from memory.
    const std::int64_t count = std::max<std::int64_t>(4, (std::int64_t{256} << 20) / (2 * K * N));
    std::vector<at::Tensor> w;
    for (std::int64_t i = 0; i < count; ++i) w.push_back(at::randn({N, K}).to(at::kBFloat16));
    const int calls = static_cast<int>(std::max<std::int64_t>(count, 40));
    for (std::int64_t M : {1, 2, 4, 8, 12, 16, 24, 32}) {
      const at::Tensor x = at::randn({M, K}).to(at::kBFloat16);
      const double bytes = 2.0 * K * N;
      auto report = [&](double s) { std::printf(" %5.0f %4.1f", s * 1e6, bytes / s / 1e9); };
      std::printf("%6lld %6lld %3lld ", (long long)K, (long long)N, (long long)M);
      report(seconds_per_call([&](int i) { (void)at::cpu::mm(x, w[i % count].t()); }, calls));
      report(seconds_per_call(
          [&](int i) { (void)at::cpu::mm(x.to(at::kFloat), w[i % count].t().to(at::kFloat)).to(at::kBFloat16); }, calls));
      for (auto isa : isas) {
        if (!few_rows_bf16_fits(x, w[0].t(), {}, isa)) {
          std::printf(" %12s", "-");
          continue;
        }
        std::printf("  ");
        report(seconds_per_call([&](int i) { (void)few_rows_bf16_mm(x, w[i % count].t(), {}, isa); }, calls));
      }
      std::printf("\n");
    }
  }
}
