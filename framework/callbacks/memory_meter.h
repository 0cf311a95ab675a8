#pragma once
// Measures a training run's memory by component (memory/memory_report.h): the live gradients and
// optimizer state, and per step the activations — the allocator's peak inside the step above what
// the step began with, less what is still allocated at its end and, where the step made them
// anew, the gradients. With a log file it writes one JSON line per step
// ({"step", "in_use", "peak", "activations"}: bytes).
//
// Reads host-side allocator counters only (no device synchronisation) and needs no hook inside
// the step: gradients are read at on_before_optimizer_step when the loop emits it, else (a
// replayed CUDA graph keeps them allocated) at the step's end.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>

#include "model/memory_report.h"
#include "model/model_registry.h"
#include "refit/callback.h"

namespace refit {

class MemoryMeterCallback : public Callback {
 public:
  MemoryMeterCallback(const ModelRegistry& models, const Stateful& optimizer, torch::Device device,
                      std::optional<std::filesystem::path> per_step_log = std::nullopt);

  void on_step_begin(const TrainState&, TrainerControl&) override;
  void on_before_optimizer_step(const TrainState&, TrainerControl&) override;
  void on_step_end(const TrainState&, const StepResult&, TrainerControl&) override;

  /// What the run held at its largest: weights, gradients and optimizer state (live tensors), the
  /// largest step's activations and the allocator's cache then (when the device's allocator counts).
  MemoryBreakdown measured() const;

 private:
  std::int64_t gradient_bytes() const;

  const ModelRegistry& models_;
  const Stateful& optimizer_;
  torch::Device device_;
  std::optional<std::ofstream> log_;
  std::int64_t baseline_ = 0;
  bool gradients_at_begin_ = false;
  std::int64_t gradients_ = 0, optimizer_state_ = 0;
  std::optional<std::int64_t> activations_, cache_;
};

}  // namespace refit
