#pragma once
// Early stopping as a policy (docs/training-loop.md, "Early stopping"): it is shown each
// validation's metrics and answers whether the metric improved and whether the run should stop.
// It holds no model, so it is tested on sequences of numbers; the Trainer acts on its verdicts
// (stops, and with restore_best keeps the best weights: train/best_weights.h). Its state is part
// of every checkpoint, so a resumed run counts the evaluations without improvement from where the
// killed run was.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/recipe.h"
#include "refit/state.h"

namespace refit {

class EarlyStopping : public Stateful {
 public:
  struct Verdict {
    bool improved = false;  // a new best (the first evaluation is one)
    bool stop = false;      // `patience` evaluations in a row without improvement
    std::string reason;     // when stopping: what happened, for the run's output and summary
  };

  explicit EarlyStopping(EarlyStoppingSpec spec) : spec_(std::move(spec)) {}

  /// One validation's metrics at `step`. Throws refit::Error when they lack the metric (the
  /// assembly checks the name before training; this is the last guard). A NaN is never a best,
  /// and it counts as an evaluation without improvement. An evaluation at a step already judged
  /// (a resumed run evaluating its checkpoint's step again) is not judged twice.
  /// `may_stop` false (the evaluation at the end of the run's duration): judged for the best
  /// weights, but it does not stop a run that ends anyway.
  Verdict observe(const std::map<std::string, double>& metrics, std::int64_t step, bool may_stop = true);
  /// Whether a verdict stopped the run (kept in checkpoints: a run killed after its stop and
  /// resumed ends at once, with the same reason).
  bool stopped() const { return stopped_; }
  const std::string& reason() const { return reason_; }

  const EarlyStoppingSpec& spec() const { return spec_; }
  std::optional<double> best() const { return best_; }
  std::optional<std::int64_t> best_step() const { return best_step_; }
  std::int64_t evaluations_without_improvement() const { return stale_; }

  /// {"stale", "stopped", "reason" (bytes), "metric" (bytes), "maximize"}, with "best",
  /// "best_step", "last_step" once judged. Loaded under another metric or mode (a resume that
  /// changed /training/early_stopping), the judgement starts afresh; under another patience, a
  /// stop stands only if the count still reaches it.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  EarlyStoppingSpec spec_;
  std::optional<double> best_;
  std::optional<std::int64_t> best_step_;
  std::int64_t stale_ = 0;
  std::optional<std::int64_t> last_step_;
  bool stopped_ = false;
  std::string reason_;
};

}  // namespace refit
