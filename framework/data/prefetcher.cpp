#include "data/prefetcher.h"

namespace refit {

Prefetcher::Prefetcher(const DataLoader& loader, std::int64_t first_step, std::int64_t end_step, PrefetchOptions options)
    : loader_(loader), end_(end_step), options_(options), next_to_schedule_(first_step), consumed_(first_step) {
  for (int i = 0; i < options_.num_workers; ++i) workers_.emplace_back([this] { work(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wanted_.notify_all();
  for (auto& w : workers_) w.join();
}

Batch Prefetcher::compute(std::int64_t step) const {
  const std::int64_t per_epoch = loader_.batches_per_epoch();
  Batch b = loader_.batch(step / per_epoch, step % per_epoch);
  if (options_.pin_memory) {
    for (auto& kv : b) kv.second = kv.second.pin_memory();
  }
  return b;
}

void Prefetcher::work() {
  for (;;) {
    std::int64_t step;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wanted_.wait(lock, [&] {
        return stopping_ || (next_to_schedule_ < end_ && next_to_schedule_ < consumed_ + options_.depth);
      });
      if (stopping_) return;
      step = next_to_schedule_++;
    }
    Batch b;
    std::exception_ptr error;
    try {
      b = compute(step);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error) failed_[step] = error;
      else
        done_[step] = std::move(b);
    }
    ready_.notify_all();
  }
}

Batch Prefetcher::get(std::int64_t step) {
  if (workers_.empty()) return compute(step);
  std::unique_lock<std::mutex> lock(mutex_);
  consumed_ = step;
  wanted_.notify_all();
  ready_.wait(lock, [&] { return done_.count(step) || failed_.count(step); });
  if (auto f = failed_.find(step); f != failed_.end()) std::rethrow_exception(f->second);
  Batch b = std::move(done_[step]);
  done_.erase(step);
  consumed_ = step + 1;
  wanted_.notify_all();
  return b;
}

}  // namespace refit
