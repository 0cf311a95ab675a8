#include "memory/device_memory.h"

#include "cuda/cuda_support.h"
#include "memory/host_allocator.h"

namespace refit {

std::optional<DeviceMemoryStats> device_memory(torch::Device device) {
  if (device.is_cpu()) {
    if (!caching_host_allocator_installed()) return std::nullopt;
    const HostAllocatorStats h = host_allocator_stats();
    return DeviceMemoryStats{static_cast<std::int64_t>(h.in_use_bytes), static_cast<std::int64_t>(h.peak_in_use_bytes),
                             static_cast<std::int64_t>(h.cached_bytes)};
  }
  const cuda::Runtime* runtime = cuda::runtime();
  if (device.is_cuda() && runtime) {
    const auto s = runtime->allocator_stats(device.has_index() ? device.index() : 0);
    return DeviceMemoryStats{s.allocated, s.peak_allocated, s.reserved - s.allocated};
  }
  return std::nullopt;
}

void reset_peak_device_memory(torch::Device device) {
  if (device.is_cpu()) reset_peak_host_allocator();
  else if (device.is_cuda() && cuda::runtime())
    cuda::runtime()->reset_peak(device.has_index() ? device.index() : 0);
}

}  // namespace refit
