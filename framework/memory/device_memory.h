#pragma once
// The bytes tensors hold on a device, now and at their peak since the last reset, and what the
// allocator keeps cached: refit's host allocator on the CPU (memory/host_allocator.h: in its size
// classes, so slightly above the tensors' own bytes), the CUDA caching allocator's statistics on
// CUDA. Reading them is host bookkeeping: no device synchronisation.
#include <cstdint>
#include <optional>

#include <torch/types.h>

namespace refit {

struct DeviceMemoryStats {
  std::int64_t in_use = 0;  // bytes of live tensors (allocator blocks handed out)
  std::int64_t peak = 0;    // the largest in_use since the last reset
  std::int64_t cached = 0;  // freed blocks kept for reuse
};

/// nullopt where nothing counts: a CPU run without refit's host allocator installed.
std::optional<DeviceMemoryStats> device_memory(torch::Device device);
/// Starts a new peak at the current in_use.
void reset_peak_device_memory(torch::Device device);

}  // namespace refit
