#pragma once
// Batches computed ahead of the loop by worker threads. A batch is a function of its global
// step only ((seed, epoch) -> order, index -> samples), so workers may finish in any order and
// the stream is still deterministic; the loop never waits for decoding when workers keep up.
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "data/loader.h"

namespace refit {

struct PrefetchOptions {
  int num_workers = 1;      // 0: compute batches on the loop's thread
  int depth = 4;            // batches computed ahead of the one being consumed
  bool pin_memory = false;  // page-locked host memory for non-blocking copies to CUDA
};

class Prefetcher {
 public:
  /// Serves the batches of global steps [first_step, end_step) of `loader`, in order.
  Prefetcher(const DataLoader& loader, std::int64_t first_step, std::int64_t end_step, PrefetchOptions options);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// The batch of global step `step` (steps must be requested in increasing order). Rethrows a
  /// worker's exception (e.g. a corrupt file) on the loop's thread.
  Batch get(std::int64_t step);

 private:
  Batch compute(std::int64_t step) const;
  void work();

  const DataLoader& loader_;
  const std::int64_t end_;
  const PrefetchOptions options_;
  std::mutex mutex_;
  std::condition_variable ready_, wanted_;
  std::int64_t next_to_schedule_;
  std::int64_t consumed_;  // steps below this are no longer needed
  std::map<std::int64_t, Batch> done_;
  std::map<std::int64_t, std::exception_ptr> failed_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace refit
