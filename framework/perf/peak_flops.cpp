#include "perf/peak_flops.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <ATen/Parallel.h>

namespace refit::perf {
namespace {

bool has_flag(const std::string& flags, const std::string& flag) {
  std::istringstream in(flags);
  for (std::string f; in >> f;)
    if (f == flag) return true;
  return false;
}

std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    return value;
  }
  return "";
}

std::string ghz_text(double ghz) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GHz", ghz);
  return buf;
}

}  // namespace

CpuDescription describe_this_cpu() {
  CpuDescription d;
  d.vendor = cpuinfo_field("vendor_id");
  try {
    d.family = std::stoi(cpuinfo_field("cpu family"));
  } catch (const std::exception&) {
  }
  d.flags = cpuinfo_field("flags");
  try {
    d.current_ghz = std::stod(cpuinfo_field("cpu MHz")) / 1000.0;
  } catch (const std::exception&) {
  }
  if (std::ifstream f{"/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"}) {
    double khz = 0;
    if (f >> khz) d.max_ghz = khz / 1e6;
  }
  d.threads = at::get_num_threads();
  return d;
}

std::optional<PeakFlops> cpu_peak(const CpuDescription& cpu, bool bf16_native) {
  const double ghz = cpu.max_ghz > 0 ? cpu.max_ghz : cpu.current_ghz;
  if (ghz <= 0 || cpu.threads < 1) return std::nullopt;
  // AMD Zen 4 (family 0x19 with AVX-512) executes 512-bit instructions as two 256-bit halves.
  const bool half_width_512 = cpu.vendor == "AuthenticAMD" && cpu.family == 0x19;
  double per_cycle = 0;
  std::string unit;
  if (bf16_native && has_flag(cpu.flags, "amx_bf16")) {
    per_cycle = 1024, unit = "AMX bf16";
  } else if (bf16_native && has_flag(cpu.flags, "avx512_bf16")) {
    per_cycle = half_width_512 ? 64 : 128, unit = "AVX512-BF16";
  } else if (has_flag(cpu.flags, "avx512f")) {
    per_cycle = half_width_512 ? 32 : 64, unit = "AVX-512 fp32 FMA";
  } else if (has_flag(cpu.flags, "avx2") && has_flag(cpu.flags, "fma")) {
    per_cycle = 32, unit = "AVX2 fp32 FMA";
  } else {
    per_cycle = 16, unit = "SSE fp32";
  }
  PeakFlops p;
  p.flops_per_second = cpu.threads * ghz * 1e9 * per_cycle;
  p.basis = std::to_string(cpu.threads) + (cpu.threads == 1 ? " thread x " : " threads x ") + ghz_text(ghz) +
            (cpu.max_ghz > 0 ? " (max)" : " (reported)") + " x " + std::to_string(static_cast<int>(per_cycle)) +
            " FLOP/cycle (" + unit + ")";
  return p;
}

std::optional<PeakFlops> gpu_peak(const std::string& gpu_name, bool half) {
  // Dense datasheet peaks in TFLOP/s: {name fragment, bf16/fp16 tensor cores, fp32}. The more
  // specific fragment first ("H100 PCIe" before "H100").
  struct Row {
    const char* fragment;
    double half, fp32;
  };
  static const Row rows[] = {
      {"H200", 989.4, 66.9}, {"H100 PCIe", 756.0, 51.2}, {"H100 NVL", 835.0, 59.8}, {"H100", 989.4, 66.9},
      {"A100", 312.0, 19.5}, {"L40S", 362.1, 91.6},      {"L40", 181.0, 90.5},      {"L4", 121.0, 30.3},
      {"A10G", 0, 0},  // AWS's variant: no published datasheet figure, so no peak
      {"A10", 125.0, 31.2},  {"V100", 125.0, 15.7},      {"T4", 65.0, 8.1},
  };
  for (const auto& r : rows) {
    if (gpu_name.find(r.fragment) == std::string::npos) continue;
    if (r.half == 0) return std::nullopt;
    PeakFlops p;
    p.flops_per_second = (half ? r.half : r.fp32) * 1e12;
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s datasheet, dense %s: %.1f TFLOP/s", r.fragment, half ? "bf16/fp16" : "fp32",
                  half ? r.half : r.fp32);
    p.basis = buf;
    return p;
  }
  return std::nullopt;
}

}  // namespace refit::perf
