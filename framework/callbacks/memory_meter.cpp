#include "callbacks/memory_meter.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "memory/device_memory.h"
#include "refit/error.h"

namespace refit {

MemoryMeterCallback::MemoryMeterCallback(const ModelRegistry& models, const Stateful& optimizer, torch::Device device,
                                         std::optional<std::filesystem::path> per_step_log)
    : models_(models), optimizer_(optimizer), device_(device) {
  if (per_step_log) {
    log_.emplace(*per_step_log, std::ios::out | std::ios::trunc);
    if (!*log_) throw Error("cannot write the memory log " + per_step_log->string());
  }
}

std::int64_t MemoryMeterCallback::gradient_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& m : models_.models())
    for (const auto& p : m.parameters)
      if (p.trainable && p.tensor.grad().defined()) bytes += p.tensor.grad().numel() * p.tensor.grad().element_size();
  return bytes;
}

void MemoryMeterCallback::on_step_begin(const TrainState&, TrainerControl&) {
  reset_peak_device_memory(device_);
  if (auto s = device_memory(device_)) baseline_ = s->in_use;
  gradients_at_begin_ = gradient_bytes() > 0;
}

void MemoryMeterCallback::on_before_optimizer_step(const TrainState&, TrainerControl&) {
  gradients_ = std::max(gradients_, gradient_bytes());
}

void MemoryMeterCallback::on_step_end(const TrainState&, const StepResult& r, TrainerControl&) {
  gradients_ = std::max(gradients_, gradient_bytes());
  // Created by the first applied update (a resumed run: loaded), the same size after it.
  if (r.window_complete && (optimizer_state_ == 0 || r.counters.iteration <= 2)) {
    std::int64_t state = 0;
    for (const auto& [name, t] : optimizer_.state_dict()) state += t.numel() * t.element_size();
    optimizer_state_ = std::max(optimizer_state_, state);
  }
  const auto s = device_memory(device_);
  if (!s) return;
  // The step's transient peak: what it allocated above its start and freed by its end. Gradients
  // made anew inside the step (set to none after the previous update) are live at that peak when
  // it falls in the backward: not activations.
  std::int64_t transient = (s->peak - baseline_) - std::max<std::int64_t>(0, s->in_use - baseline_);
  // (Gradients still live at the step's end are in that second term already.)
  if (!gradients_at_begin_) transient -= std::max<std::int64_t>(0, gradients_ - gradient_bytes());
  transient = std::max<std::int64_t>(0, transient);
  if (!activations_ || transient > *activations_) activations_ = transient, cache_ = s->cached;
  if (log_) {
    *log_ << nlohmann::json{{"step", r.counters.step}, {"in_use", s->in_use}, {"peak", s->peak}, {"activations", transient}}
                 .dump()
          << "\n";
    log_->flush();
  }
}

MemoryBreakdown MemoryMeterCallback::measured() const {
  MemoryBreakdown m = measure_memory(models_, optimizer_);
  m.gradients = std::max(m.gradients, gradients_);
  m.optimizer_state = std::max(m.optimizer_state, optimizer_state_);
  m.activations = activations_;
  m.allocator_cache = cache_;
  m.activations_note = activations_
                           ? "the largest step's allocator peak above its start, less what it kept and its new gradients"
                           : "not measured: the CPU allocator is LibTorch's (run with refit's host allocator)";
  return m;
}

}  // namespace refit
