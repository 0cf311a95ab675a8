#pragma once
// FLOPs per update, achieved FLOP/s and MFU of a training run (perf/flop_counter.h,
// perf/peak_flops.h).
//
// The products of one accumulation window are counted as they run — the first whole window
// this process trains — split into forward, backward (recomputed blocks included) and update.
// Later windows are timed from their first micro-step's start to their update's end on the host
// clock (evaluations and checkpoints fall outside windows, so they are not timed; on a GPU the
// host runs ahead of the device by a bounded queue, so over many windows the host time is the
// device's). Achieved FLOP/s = FLOPs per update x timed windows / their seconds, MFU = that over
// the peak of the arithmetic the products run in. A window of another batch shape (a shorter
// last batch, text padded to another length) has other FLOPs: the figure is the counted one's.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "perf/flop_counter.h"
#include "perf/peak_flops.h"
#include "refit/callback.h"

namespace refit {

class ComputeMeterCallback : public Callback {
 public:
  /// `accumulation`: micro-batches per window; `peak`: the device's (none: no MFU).
  ComputeMeterCallback(std::int64_t accumulation, std::optional<perf::PeakFlops> peak);
  ~ComputeMeterCallback() override;

  void on_step_begin(const TrainState&, TrainerControl&) override;
  void on_backward_begin(const TrainState&, TrainerControl&) override;
  void on_backward_end(const TrainState&, TrainerControl&) override;
  void on_optimizer_step_end(const TrainState&, const StepResult&, TrainerControl&) override;

  /// FLOPs of the counted window, 0 until it has ended.
  std::int64_t flops_per_update() const { return counted_ ? count_.total() : 0; }
  const std::optional<perf::PeakFlops>& peak() const { return peak_; }
  /// Achieved FLOP/s over the timed windows (the counted one when no other ran); 0 before.
  double flops_per_second() const;

  /// One line for the end of `refit train`: "compute: 1.23 GFLOP per update (...), ..., MFU ...".
  std::string describe() const;
  nlohmann::json to_json() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::int64_t accumulation_;
  std::optional<perf::PeakFlops> peak_;
  std::unique_ptr<perf::FlopCounter> counter_;
  bool counted_ = false;
  perf::FlopCount count_;
  std::int64_t counted_at_step_ = 0;  // the step the counted window ended at
  bool in_window_ = false;
  Clock::time_point window_start_;
  double counted_seconds_ = 0, timed_seconds_ = 0;
  std::int64_t timed_windows_ = 0;
};

}  // namespace refit
