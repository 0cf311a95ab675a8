#pragma once
// Learning-rate schedules as pure functions of the optimizer iteration (unit-tested without a
// model). Semantics follow HF transformers' get_*_schedule_with_warmup: the factor applied to
// the base learning rate at 0-based iteration k is
//   warmup (k < W):  k / W
//   constant:        1
//   linear:          max(m, 1 - (1-m) * p)        p = (k - W) / (T - W)
//   cosine:          m + (1-m) * 0.5 * (1 + cos(pi * p))
//   step:            gamma ^ floor((k - W) / step_size)
// where T is the run's total number of iterations and m is min_lr_ratio.
#include <cstdint>
#include <optional>
#include <vector>

#include "core/recipe.h"
#include "refit/callback.h"
#include "refit/state.h"

namespace refit {

class Optimizer;

double lr_factor(const SchedulerSpec& spec, std::int64_t iteration, std::int64_t total_iterations);

/// Drives an optimizer's learning rates: each group's base lr times lr_factor at the schedule's
/// position, which counts applied updates (default: a skipped window holds the schedule) or
/// iterations (/training/schedule_counts). Stateful: its checkpoint state is one entry named by
/// what it counts, "applied_updates" or "iterations", holding the position.
///
/// Where the skip is decided on the device (fused Adam/AdamW with non_finite "skip") and the
/// schedule counts applied updates, the position lives in a device counter that the update
/// itself advances (count_on_device, advance_on_device: no host read, capturable in a CUDA
/// graph) and the learning rates are the optimizer's device tensors, looked up in a table of the
/// run's factors; the host's values (Optimizer::lr, reports) then count a skip once the loop has
/// read it (Counters::skipped_iterations).
class LrSchedule : public Stateful {
 public:
  /// `counters` are the loop's (read at start, after updates and when saving).
  LrSchedule(SchedulerSpec spec, ScheduleCounts counts, std::int64_t total_iterations, Optimizer& optimizer,
             const Counters& counters);

  /// The device-counted mode (see above); call before start(). Requires Optimizer::use_device_lr().
  void count_on_device(torch::Device device);
  bool counts_on_device() const { return device_count_.defined(); }
  ScheduleCounts counts() const { return counts_; }

  /// Sets the learning rates of the next update, before the first one (after a resume too).
  void start();
  /// After an update was counted (Counters::iteration, and skipped_iterations as far as known):
  /// sets the next update's learning rates (device-counted: the host's values only).
  void after_update();
  /// Device-counted mode, inside the update after the optimizer step: advances the counter unless
  /// `skipped` (a bool device scalar) and writes the next learning rates. No host read.
  void advance_on_device(const torch::Tensor& skipped);

  /// The position as the host knows it: iterations, or iterations minus skipped ones.
  std::int64_t position() const;

  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  void set_host_lrs(std::int64_t position, bool write_device);

  SchedulerSpec spec_;
  ScheduleCounts counts_;
  std::int64_t total_;
  Optimizer& optimizer_;
  const Counters& counters_;
  std::optional<std::int64_t> restored_;  // a checkpoint's position in this schedule's unit
  torch::Tensor device_count_;            // int64 scalar: applied updates (device-counted mode)
  torch::Tensor table_;                   // float64 [total + 1]: lr_factor at every position
  std::vector<double> base_lrs_;
};

}  // namespace refit
