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

torch::Tensor bytes_tensor(const std::string& s) {
  return torch::tensor(std::vector<std::uint8_t>(s.begin(), s.end()), torch::kByte);
}

/// The bytes of `key` ("" when absent); throws on another dtype or shape.
std::string bytes_of(const StateDict& state, const std::string& key) {
  const auto it = state.find(key);
  if (it == state.end()) return "";
  if (it->second.scalar_type() != torch::kByte || it->second.dim() != 1 || it->second.numel() == 0)
    throw Error("checkpoint: early stopping's \"" + key + "\" is not a byte string (a damaged file?)");
  const torch::Tensor b = it->second.contiguous();
  return std::string(reinterpret_cast<const char*>(b.data_ptr<std::uint8_t>()), static_cast<std::size_t>(b.numel()));
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

EarlyStopping::Verdict EarlyStopping::observe(const std::map<std::string, double>& metrics, std::int64_t step,
                                              bool may_stop) {
  const auto it = metrics.find(spec_.metric);
  if (it == metrics.end())
    throw Error("/training/early_stopping/metric: the validation reported no metric \"" + spec_.metric + "\"");
  const double value = it->second;
  Verdict v;
  if (last_step_ && step <= *last_step_) return v;
  last_step_ = step;
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
  if (stale_ < spec_.patience || !may_stop) return v;
  v.stop = stopped_ = true;
  v.reason = reason_ =
      "early stopping: " + spec_.metric + " has not " + (spec_.maximize ? "risen" : "fallen") + " by more than " +
      number(spec_.min_delta) + " for " + std::to_string(stale_) + (stale_ == 1 ? " evaluation" : " evaluations") +
      " (best " + (best_ ? number(*best_) + " at step " + std::to_string(*best_step_) : std::string("none: not finite")) +
      ", now " + number(value) + " at step " + std::to_string(step) + ")";
  return v;
}

StateDict EarlyStopping::state_dict() const {
  StateDict s{{"stale", torch::tensor(stale_, torch::kLong)},
              {"stopped", torch::tensor(static_cast<std::int64_t>(stopped_), torch::kLong)}};
  if (!reason_.empty()) s["reason"] = bytes_tensor(reason_);
  s["metric"] = bytes_tensor(spec_.metric);
  s["maximize"] = torch::tensor(static_cast<std::int64_t>(spec_.maximize), torch::kLong);
  if (best_) {
    s["best"] = torch::tensor(*best_, torch::kDouble);
    s["best_step"] = torch::tensor(*best_step_, torch::kLong);
  }
  if (last_step_) s["last_step"] = torch::tensor(*last_step_, torch::kLong);
  return s;
}

void EarlyStopping::load_state_dict(const StateDict& state) {
  const std::int64_t stale = scalar_of(state, "stale", torch::kLong).item<std::int64_t>();
  if (stale < 0) throw Error("checkpoint: early stopping's count of evaluations is negative (a damaged file?)");
  std::optional<double> best;
  std::optional<std::int64_t> best_step, last_step;
  if (state.count("best") || state.count("best_step")) {
    best = scalar_of(state, "best", torch::kDouble).item<double>();
    // observe() never keeps a non-finite best: one in a file is damage, and would never be beaten.
    if (!std::isfinite(*best)) throw Error("checkpoint: early stopping's best is not finite (a damaged file?)");
    best_step = scalar_of(state, "best_step", torch::kLong).item<std::int64_t>();
  }
  if (state.count("last_step")) last_step = scalar_of(state, "last_step", torch::kLong).item<std::int64_t>();
  const bool stopped = scalar_of(state, "stopped", torch::kLong).item<std::int64_t>() != 0;
  std::string reason = bytes_of(state, "reason");
  if (stopped && reason.empty())
    throw Error("checkpoint: early stopping stopped the run but gives no reason (a damaged file?)");
  const std::string metric = bytes_of(state, "metric");
  const bool maximize = state.count("maximize") && scalar_of(state, "maximize", torch::kLong).item<std::int64_t>() != 0;
  if (metric != spec_.metric || maximize != spec_.maximize) {
    // Another metric or direction: the saved best means nothing now.
    stale_ = 0, best_.reset(), best_step_.reset(), last_step_ = last_step, stopped_ = false, reason_.clear();
    return;
  }
  stale_ = stale, best_ = best, best_step_ = best_step, last_step_ = last_step;
  stopped_ = stopped && stale >= spec_.patience;  // a larger patience gives the run more evaluations
  reason_ = stopped_ ? std::move(reason) : std::string();
}

}  // namespace refit
