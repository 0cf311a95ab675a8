#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "refit/error.h"
#include "train/optimizer.h"

namespace refit {

double lr_factor(const SchedulerSpec& s, std::int64_t k, std::int64_t total) {
  if (k < s.warmup) return static_cast<double>(k) / static_cast<double>(std::max<std::int64_t>(1, s.warmup));
  const double m = s.min_lr_ratio;
  const double span = static_cast<double>(std::max<std::int64_t>(1, total - s.warmup));
  const double p = std::min(1.0, static_cast<double>(k - s.warmup) / span);
  if (s.type == "linear") return std::max(m, 1.0 - (1.0 - m) * p);
  if (s.type == "cosine") return m + (1.0 - m) * 0.5 * (1.0 + std::cos(M_PI * p));
  if (s.type == "step")
    return std::pow(s.gamma, static_cast<double>((k - s.warmup) / std::max<std::int64_t>(1, s.step_size)));
  return 1.0;
}

namespace {
const char* unit_name(ScheduleCounts c) { return c == ScheduleCounts::iterations ? "iterations" : "applied_updates"; }
}  // namespace

LrSchedule::LrSchedule(SchedulerSpec spec, ScheduleCounts counts, std::int64_t total_iterations, Optimizer& optimizer,
                       const Counters& counters)
    : spec_(std::move(spec)), counts_(counts), total_(total_iterations), optimizer_(optimizer), counters_(counters) {
  for (std::size_t g = 0; g < optimizer_.group_count(); ++g) base_lrs_.push_back(optimizer_.group(g).lr);
}

void LrSchedule::count_on_device(torch::Device device) {
  if (counts_ != ScheduleCounts::applied_updates) return;  // iterations are known on the host
  std::vector<double> factors(static_cast<std::size_t>(total_ + 1));
  for (std::int64_t k = 0; k <= total_; ++k) factors[static_cast<std::size_t>(k)] = lr_factor(spec_, k, total_);
  table_ = torch::tensor(factors, torch::kDouble).to(device);
  device_count_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
}

std::int64_t LrSchedule::position() const {
  return counts_ == ScheduleCounts::iterations ? counters_.iteration : counters_.iteration - counters_.skipped_iterations;
}

void LrSchedule::set_host_lrs(std::int64_t position, bool write_device) {
  const double f = lr_factor(spec_, position, total_);
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    if (write_device) optimizer_.set_lr(g, base_lrs_[g] * f);
    else
      optimizer_.set_host_lr(g, base_lrs_[g] * f);
  }
}

void LrSchedule::start() {
  // A checkpoint's counters are exact (the loop reads pending skips before saving), so the
  // position follows from them; a checkpoint of the same unit states it, and that is used.
  const std::int64_t at = restored_ ? *restored_ : position();
  restored_.reset();
  set_host_lrs(at, /*write_device=*/true);
  if (!counts_on_device()) return;
  device_count_.fill_(at);
  for (std::size_t g = 0; g < base_lrs_.size(); ++g)
    optimizer_.device_lr(g).fill_(base_lrs_[g] * lr_factor(spec_, at, total_));
}

void LrSchedule::after_update() { set_host_lrs(position(), /*write_device=*/!counts_on_device()); }

void LrSchedule::advance_on_device(const torch::Tensor& skipped) {
  device_count_.add_(skipped.logical_not().to(torch::kLong));
  const torch::Tensor f = table_.index_select(0, device_count_.clamp_max(total_).reshape({1})).reshape({});
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    torch::Tensor& lr = optimizer_.device_lr(g);
    lr.copy_(f * base_lrs_[g]);
  }
}

StateDict LrSchedule::state_dict() const { return {{unit_name(counts_), torch::tensor(position(), torch::kLong)}}; }

void LrSchedule::load_state_dict(const StateDict& state) {
  auto it = state.find(unit_name(counts_));
  // Another unit (the recipe changed /training/schedule_counts): the position in this unit
  // follows from the restored counters.
  if (it == state.end()) {
    if (!state.count(
            unit_name(counts_ == ScheduleCounts::iterations ? ScheduleCounts::applied_updates : ScheduleCounts::iterations)))
      throw Error("the schedule's state has neither \"applied_updates\" nor \"iterations\"");
    restored_.reset();
    return;
  }
  if (it->second.numel() != 1) throw Error("the schedule's state \"" + it->first + "\" is not one number");
  restored_ = it->second.item<std::int64_t>();
}

}  // namespace refit
