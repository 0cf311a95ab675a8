#include "memory/host_allocator.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace refit {
namespace {

// LibTorch's own CPU allocator aligns to 64 bytes (c10's gAlignment); so do we. Each block carries
// a header of one alignment unit holding its class size, so the raw deleter (which gets only the
// pointer) knows where to put the block back.
constexpr std::size_t kAlignment = 64;
constexpr std::size_t kHeader = kAlignment;

class CachingHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::kCPU)};
    const std::size_t size = host_allocator_size_class(n);
    void* user = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.allocations;
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        user = it->second.back();
        it->second.pop_back();
        stats_.cached_bytes -= size;
        ++stats_.cache_hits;
      }
      stats_.in_use_bytes += size;
    }
    if (!user) user = fresh_block(size);
    if (c10::memoryProfilingEnabled())
      c10::reportMemoryUsageToProfiler(user, static_cast<std::int64_t>(n), in_use(), reserved(), c10::Device(c10::kCPU));
    return {user, user, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static void release(void* user) {
    if (!user) return;
    instance().give_back(user);
  }

  static CachingHostAllocator& instance() {
    // Never destroyed: tensors freed during static destruction still find it.
    static auto* allocator = new CachingHostAllocator();
    return *allocator;
  }

  void set_options(const HostAllocatorOptions& options) {
    std::lock_guard<std::mutex> lock(mutex_);
    options_ = options;
    trim_locked(options_.max_cached_bytes);
  }
  HostAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    trim_locked(0);
  }

 private:
  static std::size_t& header_of(void* user) {
    return *reinterpret_cast<std::size_t*>(static_cast<char*>(user) - kHeader);
  }
  static void* fresh_block(std::size_t size) {
    void* base = nullptr;
    if (posix_memalign(&base, kAlignment, size + kHeader) != 0 || !base) {
      instance().forget(size);
      if (c10::memoryProfilingEnabled())
        c10::reportOutOfMemoryToProfiler(static_cast<std::int64_t>(size), 0, 0, c10::Device(c10::kCPU));
      TORCH_CHECK_WITH(OutOfMemoryError, false, "refit host allocator: out of memory allocating ", size,
                       " bytes (", instance().stats().cached_bytes, " bytes cached)");
    }
    void* user = static_cast<char*>(base) + kHeader;
    header_of(user) = size;
    return user;
  }
  void forget(std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.in_use_bytes -= size;
  }
  void give_back(void* user) {
    const std::size_t size = header_of(user);
    if (c10::memoryProfilingEnabled())
      c10::reportMemoryUsageToProfiler(user, -static_cast<std::int64_t>(size), in_use() - size, reserved(), c10::Device(c10::kCPU));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.in_use_bytes -= size;
      if (stats_.cached_bytes + size <= options_.max_cached_bytes) {
        free_[size].push_back(user);
        stats_.cached_bytes += size;
        return;
      }
    }
    std::free(static_cast<char*>(user) - kHeader);
  }
  // Frees cached blocks, largest classes first, until at most `limit` bytes stay cached.
  void trim_locked(std::size_t limit) {
    while (stats_.cached_bytes > limit) {
      auto largest = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (!it->second.empty() && (largest == free_.end() || it->first > largest->first)) largest = it;
      if (largest == free_.end()) break;
      std::free(static_cast<char*>(largest->second.back()) - kHeader);
      largest->second.pop_back();
      stats_.cached_bytes -= largest->first;
    }
  }
  std::size_t in_use() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_.in_use_bytes;
  }
  std::size_t reserved() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_.in_use_bytes + stats_.cached_bytes;
  }

  std::mutex mutex_;
  HostAllocatorOptions options_;
  HostAllocatorStats stats_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
};

std::once_flag g_install;
bool g_installed = false;

}  // namespace

std::size_t host_allocator_size_class(std::size_t bytes) {
  // Eight classes per power of two above 512 bytes (at most 12.5 % of a block unused), multiples
  // of 64 below: a step's requests of nearly equal size share a class and its cached blocks.
  if (bytes <= 512) return ((bytes + kAlignment - 1) / kAlignment) * kAlignment;
  std::size_t top = std::size_t{1} << (63 - __builtin_clzll(bytes));
  std::size_t step = top / 8;
  return ((bytes + step - 1) / step) * step;
}

bool install_caching_host_allocator(const HostAllocatorOptions& options) {
  CachingHostAllocator::instance().set_options(options);
  std::call_once(g_install, [] {
    // The highest priority c10 accepts: nothing registered later at a lower one replaces it.
    c10::SetCPUAllocator(&CachingHostAllocator::instance(), /*priority=*/255);
    g_installed = c10::GetCPUAllocator() == &CachingHostAllocator::instance();
  });
  return g_installed;
}

bool caching_host_allocator_installed() { return c10::GetCPUAllocator() == &CachingHostAllocator::instance(); }

HostAllocatorStats host_allocator_stats() { return CachingHostAllocator::instance().stats(); }

void release_cached_host_memory() { CachingHostAllocator::instance().release_all(); }

}  // namespace refit
