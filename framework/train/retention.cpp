#include "train/retention.h"

#include <algorithm>
#include <set>

namespace refit {

std::vector<std::int64_t> checkpoints_to_delete(const std::vector<CheckpointRecord>& records,
                                                const RetentionPolicy& policy) {
  if (records.empty() || (policy.keep_last <= 0 && policy.keep_best <= 0)) return {};
  std::vector<CheckpointRecord> by_step = records;
  std::sort(by_step.begin(), by_step.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  std::set<std::int64_t> keep{by_step.front().step};
  for (std::int64_t i = 0; i < policy.keep_last && i < static_cast<std::int64_t>(by_step.size()); ++i)
    keep.insert(by_step[i].step);
  if (policy.keep_best > 0) {
    std::vector<CheckpointRecord> scored;
    for (const auto& r : by_step)
      if (r.ranked()) scored.push_back(r);
    // Stable: among equal metrics the newer checkpoint ranks first.
    std::stable_sort(scored.begin(), scored.end(), [&](const auto& a, const auto& b) {
      return policy.maximize ? *a.metric > *b.metric : *a.metric < *b.metric;
    });
    for (std::int64_t i = 0; i < policy.keep_best && i < static_cast<std::int64_t>(scored.size()); ++i)
      keep.insert(scored[i].step);
  }
  std::vector<std::int64_t> out;
  for (const auto& r : by_step)
    if (!keep.count(r.step)) out.push_back(r.step);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace refit
