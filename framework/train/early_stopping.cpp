#include "train/early_stopping.h"

#include <cmath>
#include <cstdio>

#include "refit/error.h"

namespace refit {

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

torch::Tensor scalar_of(const StateDict& state, const std::string& key, torch::ScalarType type) {
  const auto it = state.find(key);
  if (it == state.end()) throw Error("checkpoint: early stopping's state has no \"" + key + "\" (a damaged file?)");
  if (it->second.numel() != 1 || it->second.scalar_type() != type)
    throw Error("checkpoint: early stopping's \"" + key + "\" is not one " + std::string(c10::toString(type)) +
                " (a damaged file?)");
  return it->second;
}

}  // namespace

EarlyStopping::Verdict EarlyStopping::observe(const std::map<std::string, double>& metrics, std::int64_t step) {
  const auto it = metrics.find(spec_.metric);
  if (it == metrics.end())
    throw Error("/training/early_stopping/metric: the validation reported no metric \"" + spec_.metric + "\"");
  const double value = it->second;
  Verdict v;
  // min_delta: the margin by which the metric must beat the best to count as better.
  const bool finite = std::isfinite(value);
  if (finite && (!best_ || (spec_.maximize ? value > *best_ + spec_.min_delta : value < *best_ - spec_.min_delta))) {
    best_ = value;
    best_step_ = step;
    stale_ = 0;
    v.improved = true;
    return v;
  }
  ++stale_;
  if (stale_ < spec_.patience) return v;
  v.stop = true;
  v.reason = "early stopping: " + spec_.metric + " has not " + (spec_.maximize ? "risen" : "fallen") + " by more than " +
             number(spec_.min_delta) + " for " + std::to_string(stale_) + (stale_ == 1 ? " evaluation" : " evaluations") +
             " (best " +
             (best_ ? number(*best_) + " at step " + std::to_string(*best_step_) : std::string("none: not finite")) +
             ", now " + number(value) + " at step " + std::to_string(step) + ")";
  return v;
}

StateDict EarlyStopping::state_dict() const {
  StateDict s{{"stale", torch::tensor(stale_, torch::kLong)}};
  if (best_) {
    s["best"] = torch::tensor(*best_, torch::kDouble);
    s["best_step"] = torch::tensor(*best_step_, torch::kLong);
  }
  return s;
}

void EarlyStopping::load_state_dict(const StateDict& state) {
  const std::int64_t stale = scalar_of(state, "stale", torch::kLong).item<std::int64_t>();
  if (stale < 0) throw Error("checkpoint: early stopping's count of evaluations is negative (a damaged file?)");
  std::optional<double> best;
  std::optional<std::int64_t> best_step;
  if (state.count("best") || state.count("best_step")) {
    best = scalar_of(state, "best", torch::kDouble).item<double>();
    best_step = scalar_of(state, "best_step", torch::kLong).item<std::int64_t>();
  }
  stale_ = stale, best_ = best, best_step_ = best_step;
}

}  // namespace refit
