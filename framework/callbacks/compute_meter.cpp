#include "callbacks/compute_meter.h"

#include <cstdio>

namespace refit {
namespace {

std::string giga(double flops) {
  char buf[48];
  if (flops >= 1e12) std::snprintf(buf, sizeof buf, "%.3g TFLOP", flops / 1e12);
  else if (flops >= 1e9)
    std::snprintf(buf, sizeof buf, "%.3g GFLOP", flops / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.3g MFLOP", flops / 1e6);
  return buf;
}

}  // namespace

ComputeMeterCallback::ComputeMeterCallback(std::int64_t accumulation, std::optional<perf::PeakFlops> peak)
    : accumulation_(accumulation < 1 ? 1 : accumulation), peak_(std::move(peak)) {}

ComputeMeterCallback::~ComputeMeterCallback() = default;

void ComputeMeterCallback::on_step_begin(const TrainState& s, TrainerControl&) {
  const bool window_start = s.counters.step % accumulation_ == 0;
  if (window_start) {
    // The first whole window is counted (a resumed run inside a window waits for the next one).
    if (!counted_ && !counter_) counter_ = std::make_unique<perf::FlopCounter>();
    in_window_ = true;
    window_start_ = Clock::now();
  }
  if (counter_) counter_->set_phase(perf::StepPhase::forward);
}

void ComputeMeterCallback::on_backward_begin(const TrainState&, TrainerControl&) {
  if (counter_) counter_->set_phase(perf::StepPhase::backward);
}

void ComputeMeterCallback::on_backward_end(const TrainState&, TrainerControl&) {
  if (counter_) counter_->set_phase(perf::StepPhase::update);
}

void ComputeMeterCallback::on_optimizer_step_end(const TrainState& s, const StepResult&, TrainerControl&) {
  if (!in_window_) return;
  in_window_ = false;
  const double seconds = std::chrono::duration<double>(Clock::now() - window_start_).count();
  if (counter_) {
    count_ = counter_->count();
    counter_.reset();
    counted_ = true;
    counted_at_step_ = s.counters.step;
    counted_seconds_ = seconds;  // with the observer's cost in it: not a timed window
    return;
  }
  if (counted_) {
    timed_seconds_ += seconds;
    ++timed_windows_;
  }
}

double ComputeMeterCallback::flops_per_second() const {
  if (!counted_) return 0;
  const double total = static_cast<double>(count_.total());
  if (timed_windows_ > 0 && timed_seconds_ > 0) return total * static_cast<double>(timed_windows_) / timed_seconds_;
  return counted_seconds_ > 0 ? total / counted_seconds_ : 0;
}

std::string ComputeMeterCallback::describe() const {
  if (!counted_) return "compute: no whole update ran, no FLOPs counted";
  std::string s = "compute: " + giga(static_cast<double>(count_.total())) + " per update (forward " +
                  giga(static_cast<double>(count_.forward)) + ", backward " + giga(static_cast<double>(count_.backward));
  if (count_.update > 0) s += ", update " + giga(static_cast<double>(count_.update));
  s += "; products counted on the update ending at step " + std::to_string(counted_at_step_) + ")";
  const double rate = flops_per_second();
  if (rate <= 0) return s;
  s += ", " + giga(rate) + "/s";
  s += timed_windows_ > 0 ? " over " + std::to_string(timed_windows_) + " timed updates"
                          : " (the counted update alone: no other was timed)";
  if (peak_ && peak_->flops_per_second > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", MFU %.2f %% of ", 100.0 * rate / peak_->flops_per_second);
    s += buf + giga(peak_->flops_per_second) + "/s (" + peak_->basis + ")";
  } else {
    s += ", MFU not reported (no peak known for this device)";
  }
  return s;
}

nlohmann::json ComputeMeterCallback::to_json() const {
  nlohmann::json j;
  if (!counted_) return j;
  j["flops_per_update"] = count_.total();
  j["forward_flops"] = count_.forward;
  j["backward_flops"] = count_.backward;
  j["update_flops"] = count_.update;
  j["flops_by_operator"] = count_.by_operator;
  j["counted_at_step"] = counted_at_step_;
  j["timed_updates"] = timed_windows_;
  j["timed_seconds"] = timed_seconds_;
  j["flops_per_second"] = flops_per_second();
  if (peak_ && peak_->flops_per_second > 0) {
    j["peak_flops_per_second"] = peak_->flops_per_second;
    j["peak_basis"] = peak_->basis;
    j["mfu"] = flops_per_second() / peak_->flops_per_second;
  }
  return j;
}

}  // namespace refit
