#pragma once
// Which checkpoints to keep: a pure function, unit-tested without a model.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace refit {

struct CheckpointRecord {
  std::int64_t step = 0;
  std::optional<double> metric;             // the watched metric of an evaluation at save time
  std::optional<std::int64_t> metric_step;  // the step that evaluation ran at
  /// Ranked by keep_best only when the metric is of this checkpoint's own weights (evaluated at
  /// its step); checkpoints of refit 0.4 record no step and are not ranked.
  bool ranked() const { return metric && metric_step && *metric_step == step; }
};

struct RetentionPolicy {
  std::int64_t keep_last = 0;   // newest N (0 = keep all unless keep_best limits)
  std::int64_t keep_best = 0;   // best N by metric
  std::string metric = "loss";  // e.g. "loss", "accuracy"
  bool maximize = false;        // true for accuracy-like metrics
};

/// Steps of the checkpoints to delete. The newest checkpoint is always kept (it is what resume
/// uses); with both limits 0 nothing is deleted; a checkpoint kept by either rule survives.
/// keep_best ranks only checkpoints whose metric is their own (CheckpointRecord::ranked).
std::vector<std::int64_t> checkpoints_to_delete(const std::vector<CheckpointRecord>& records, const RetentionPolicy& policy);

/// Whether the loop writes a checkpoint right after each evaluation (a candidate ranked by that
/// evaluation of its own weights, as Lightning's ModelCheckpoint does): with keep_best.
inline bool checkpoint_after_evaluation(const RetentionPolicy& policy) { return policy.keep_best > 0; }

}  // namespace refit
