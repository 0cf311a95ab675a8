// Dequantizes every tensor of a GGUF file to bf16 (or fp32 with --fp32) and keeps them all, as
// loading a model does; prints the time and the bytes produced. Run under /usr/bin/time -v for
// the peak RSS (docs/gguf.md):
//   /usr/bin/time -v build/bench/bench_gguf_dequantize "$REFIT_SMOLLM2_GGUF"
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "refit/error.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE.gguf [--fp32]\n", argv[0]);
    return 2;
  }
  const bool fp32 = argc > 2 && std::strcmp(argv[2], "--fp32") == 0;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const auto f = refit::io::GgufFile::open(argv[1]);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<std::vector<std::uint16_t>> bf16;
    std::vector<std::vector<float>> f32;
    std::uint64_t packed = 0, produced = 0, elements = 0;
    for (const auto& t : f.tensors()) {
      const auto n = static_cast<std::size_t>(t.numel());
      if (fp32) {
        f32.emplace_back(n);
        f.dequantize(t.name, f32.back().data());
        produced += n * 4;
      } else {
        bf16.emplace_back(n);
        f.dequantize_bf16(t.name, bf16.back().data());
        produced += n * 2;
      }
      packed += t.nbytes;
      elements += n;
    }
    const auto t2 = std::chrono::steady_clock::now();
    const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    std::printf("%s: %zu tensors, %.1f M elements, %.1f MB packed -> %.1f MB %s\n", argv[1], f.tensors().size(),
                elements / 1e6, packed / 1e6, produced / 1e6, fp32 ? "fp32" : "bf16");
    std::printf("open (header, %zu metadata keys): %.1f ms; dequantize: %.1f ms (%.0f M elements/s)\n", f.metadata().size(),
                ms(t0, t1), ms(t1, t2), elements / 1e3 / ms(t1, t2));
  } catch (const refit::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
