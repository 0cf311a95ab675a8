#include "memory/device_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>

#include "memory/host_allocator.h"

namespace refit {

std::optional<DeviceMemoryStats> device_memory(torch::Device device) {
  if (device.is_cpu()) {
    if (!caching_host_allocator_installed()) return std::nullopt;
    const HostAllocatorStats h = host_allocator_stats();
    return DeviceMemoryStats{static_cast<std::int64_t>(h.in_use_bytes), static_cast<std::int64_t>(h.peak_in_use_bytes),
                             static_cast<std::int64_t>(h.cached_bytes)};
  }
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const auto& allocated = stats.allocated_bytes[all];
    return DeviceMemoryStats{allocated.current, allocated.peak, stats.reserved_bytes[all].current - allocated.current};
  }
  return std::nullopt;
}

void reset_peak_device_memory(torch::Device device) {
  if (device.is_cpu()) reset_peak_host_allocator();
  else if (device.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
}

}  // namespace refit
