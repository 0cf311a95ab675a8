#include "memory/host_allocator.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

namespace refit {
namespace {

// LibTorch's own CPU allocator aligns to 64 bytes (c10's gAlignment); so do we. Each block carries
// a header of one alignment unit: its class size and the bytes asked for, so the raw deleter
// (which gets only the pointer) knows where to put the block back.
constexpr std::size_t kAlignment = 64;
constexpr std::size_t kHeader = kAlignment;
// Blocks larger than this share of the cap go back to the system when freed: one-off giants
// (loading, evaluation) would otherwise fill the cache with classes no step asks for again.
constexpr std::size_t kLargestCachedShare = 8;

struct Header {
  std::size_t size;  // class size
  std::size_t requested;
};
static_assert(sizeof(Header) <= kHeader);

class CachingHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::kCPU)};
    TORCH_CHECK_WITH(OutOfMemoryError, n <= static_cast<std::size_t>(PTRDIFF_MAX) - 2 * kHeader,
                     "refit host allocator: cannot allocate ", n, " bytes");
    const std::size_t size = host_allocator_size_class(n);
    void* user = nullptr;
    std::size_t in_use = 0, reserved = 0;  // for the memory profiler
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
      stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
      in_use = stats_.in_use_bytes;
      reserved = stats_.in_use_bytes + stats_.cached_bytes + (user ? 0 : size);
    }
    if (!user) user = fresh_block(size);
    header_of(user).requested = n;
    if (c10::memoryProfilingEnabled())
      c10::reportMemoryUsageToProfiler(user, static_cast<std::int64_t>(n), in_use, reserved, c10::Device(c10::kCPU));
    return {user, user, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static void release(void* user) {
    if (user) instance().give_back(user);
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
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }
  void release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    trim_locked(0);
  }

 private:
  static Header& header_of(void* user) { return *reinterpret_cast<Header*>(static_cast<char*>(user) - kHeader); }
  static void* fresh_block(std::size_t size) {
    void* base = nullptr;
    if (posix_memalign(&base, kAlignment, size + kHeader) != 0 || !base) {
      instance().release_all();  // what the cache holds may be what the system lacks: once more
      if (posix_memalign(&base, kAlignment, size + kHeader) != 0 || !base) {
        instance().forget(size);
        if (c10::memoryProfilingEnabled())
          c10::reportOutOfMemoryToProfiler(static_cast<std::int64_t>(size), 0, 0, c10::Device(c10::kCPU));
        TORCH_CHECK_WITH(OutOfMemoryError, false, "refit host allocator: out of memory allocating ", size, " bytes");
      }
    }
    void* user = static_cast<char*>(base) + kHeader;
    header_of(user) = Header{size, 0};
    std::lock_guard<std::mutex> lock(instance().mutex_);
    instance().owned_.insert(user);
    return user;
  }
  void forget(std::size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.in_use_bytes -= size;
  }
  void give_back(void* user) {
    std::unique_lock<std::mutex> lock(mutex_);
    // LibTorch's oneDNN glue frees with whatever the CPU allocator is *now*
    // (GetAllocator(kCPU)->raw_deallocate), so a buffer from the allocator installed before this
    // one can arrive here. Only blocks this allocator made have a header (reading before any
    // other pointer could touch an unmapped page): the rest go back to c10's free.
    if (!owned_.count(user)) {
      ++stats_.foreign_frees;
      lock.unlock();
      c10::free_cpu(user);
      return;
    }
    const Header header = header_of(user);
    stats_.in_use_bytes -= header.size;
    const bool keep = header.size <= options_.max_cached_bytes / kLargestCachedShare &&
                      stats_.cached_bytes + header.size <= options_.max_cached_bytes;
    if (keep) {
      free_[header.size].push_back(user);
      stats_.cached_bytes += header.size;
    } else {
      owned_.erase(user);
    }
    const std::size_t in_use = stats_.in_use_bytes, reserved = stats_.in_use_bytes + stats_.cached_bytes;
    lock.unlock();
    if (c10::memoryProfilingEnabled())  // the bytes reported when it was handed out; outside the lock
      c10::reportMemoryUsageToProfiler(user, -static_cast<std::int64_t>(header.requested), in_use, reserved,
                                       c10::Device(c10::kCPU));
    if (!keep) std::free(static_cast<char*>(user) - kHeader);
  }
  // Frees cached blocks, largest classes first, until at most `limit` bytes stay cached.
  void trim_locked(std::size_t limit) {
    std::vector<std::size_t> classes;
    for (const auto& [size, blocks] : free_)
      if (!blocks.empty()) classes.push_back(size);
    std::sort(classes.rbegin(), classes.rend());
    for (std::size_t size : classes) {
      auto& blocks = free_[size];
      while (stats_.cached_bytes > limit && !blocks.empty()) {
        owned_.erase(blocks.back());
        std::free(static_cast<char*>(blocks.back()) - kHeader);
        blocks.pop_back();
        stats_.cached_bytes -= size;
      }
    }
  }

  std::mutex mutex_;
  HostAllocatorOptions options_;
  HostAllocatorStats stats_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::unordered_set<void*> owned_;  // every block made here and not yet returned to the system
};

std::once_flag g_install;

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
  // The highest priority c10 accepts: nothing registered later at a lower one replaces it.
  std::call_once(g_install, [] { c10::SetCPUAllocator(&CachingHostAllocator::instance(), /*priority=*/255); });
  return caching_host_allocator_installed();
}

bool caching_host_allocator_installed() { return c10::GetCPUAllocator() == &CachingHostAllocator::instance(); }

HostAllocatorStats host_allocator_stats() { return CachingHostAllocator::instance().stats(); }

void release_cached_host_memory() { CachingHostAllocator::instance().release_all(); }

void reset_peak_host_allocator() { CachingHostAllocator::instance().reset_peak(); }

}  // namespace refit
