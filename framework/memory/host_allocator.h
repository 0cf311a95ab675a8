#pragma once
// A caching allocator for CPU tensors: freed blocks are kept in size classes and handed out again.
//
// Why: a training step on the CPU allocates and frees the same few hundred buffers every step.
// Through glibc each large one is a fresh mmap (page faults on first touch, munmap on free) or a
// trip through malloc's bins and heap trimming; measured on the 12 x 512 LoRA MLP step that was
// ~200 page faults and ~20 % of the step's time. A block freed here goes back to its size class
// and is reused by the next step's request of the same class, already mapped.
//
// Scope: the whole process (LibTorch has one CPU allocator). Tensors allocated before it is
// installed keep their own deleter; raw buffers from before (oneDNN's, freed through whichever
// allocator is current) are not among the blocks it made and go back to c10's free.
// Thread-safe (loader threads allocate).
#include <cstddef>
#include <cstdint>

namespace refit {

struct HostAllocatorOptions {
  /// Freed bytes kept for reuse, all classes together; a block freed beyond it goes to the system,
  /// as does any block larger than an eighth of it. `refit train --host-cache-mib` sets it.
  std::size_t max_cached_bytes = std::size_t{1} << 30;
};

struct HostAllocatorStats {
  std::uint64_t allocations = 0;      // requests served
  std::uint64_t cache_hits = 0;       // requests served from a cached block
  std::size_t cached_bytes = 0;       // bytes in free blocks now
  std::size_t in_use_bytes = 0;       // bytes in blocks handed out and not yet freed (class sizes)
  std::size_t peak_in_use_bytes = 0;  // the largest in_use_bytes since the last reset_peak_host_allocator()
  std::uint64_t foreign_frees = 0;    // blocks from the allocator before this one, freed through it
};

/// Makes the caching allocator LibTorch's CPU allocator (once per process; later calls only
/// update the options). Returns false if it could not be installed.
bool install_caching_host_allocator(const HostAllocatorOptions& options = {});
/// Whether the caching allocator is LibTorch's CPU allocator now.
bool caching_host_allocator_installed();
HostAllocatorStats host_allocator_stats();
/// Starts a new peak (HostAllocatorStats::peak_in_use_bytes) at the current bytes in use.
void reset_peak_host_allocator();
/// Returns every cached block to the system (blocks in use stay valid).
void release_cached_host_memory();
/// The size class a request of `bytes` is served from (exposed for tests).
std::size_t host_allocator_size_class(std::size_t bytes);

}  // namespace refit
