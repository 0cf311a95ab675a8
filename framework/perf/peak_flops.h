#pragma once
// The peak FLOP/s of the arithmetic a run's products execute in, for MFU (model FLOPs
// utilisation: achieved FLOP/s over this peak).
//
// CPU: threads x clock x FLOPs per cycle and core of the vector units the products use —
//   fp32 FMA: AVX2 32 (2 x 256-bit FMA), AVX-512 64 (2 x 512-bit; AMD Zen 4 32, its 512-bit
//   instructions run as two 256-bit halves), bf16 with native kernels: AVX512-BF16 128
//   (vdpbf16ps, 2 units), AMX-BF16 1024 (one tile multiply unit).
//   The clock is the CPU's maximum (cpufreq) where the kernel exposes it, else /proc/cpuinfo's
//   current "cpu MHz" (what a VM reports). bf16 products routed through fp32 kernels
//   (precision/bf16_products.h) run at the fp32 peak.
// GPU: the datasheet's dense peak for the model name (bf16/fp16 tensor cores, fp32 without
//   TF32), from a table; an unknown GPU has no peak (MFU is then not reported).
#include <optional>
#include <string>

namespace refit::perf {

struct PeakFlops {
  double flops_per_second = 0;
  std::string basis;  // how it was derived, for the report: "2 threads x 2.45 GHz x 32 FLOP/cycle (AVX2 fp32 FMA)"
};

/// What a CPU offers, as /proc/cpuinfo describes it (a test passes its own).
struct CpuDescription {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD"
  int family = 0;          // "cpu family"
  std::string flags;       // the "flags" line
  double max_ghz = 0;      // cpufreq's maximum, 0 when not exposed
  double current_ghz = 0;  // "cpu MHz" / 1000
  int threads = 1;         // the intra-op threads the products run on
};
CpuDescription describe_this_cpu();

/// `bf16_native`: the products run in bf16 on native kernels (else fp32 arithmetic).
std::optional<PeakFlops> cpu_peak(const CpuDescription& cpu, bool bf16_native);

/// `half`: bf16/fp16 products (tensor cores); else fp32. `gpu_name` as the driver names it.
std::optional<PeakFlops> gpu_peak(const std::string& gpu_name, bool half);

}  // namespace refit::perf
