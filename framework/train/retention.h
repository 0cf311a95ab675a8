#pragma once
// Which checkpoints to keep: a pure function, unit-tested without a model.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace refit {

struct CheckpointRecord {
  std::int64_t step = 0;
  std::optional<double> metric;  // the watched metric at save time, if an evaluation had run
};

struct RetentionPolicy {
  std::int64_t keep_last = 0;    // newest N (0 = keep all unless keep_best limits)
  std::int64_t keep_best = 0;    // best N by metric
  std::string metric = "loss";   // e.g. "loss", "accuracy"
  bool maximize = false;         // true for accuracy-like metrics
};

/// Steps of the checkpoints to delete. The newest checkpoint is always kept (it is what resume
/// uses); with both limits 0 nothing is deleted; a checkpoint kept by either rule survives.
std::vector<std::int64_t> checkpoints_to_delete(const std::vector<CheckpointRecord>& records,
                                                const RetentionPolicy& policy);

}  // namespace refit
