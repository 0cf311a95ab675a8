#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace refit {

double lr_factor(const SchedulerSpec& s, std::int64_t k, std::int64_t total) {
  if (k < s.warmup) return static_cast<double>(k) / static_cast<double>(std::max<std::int64_t>(1, s.warmup));
  const double m = s.min_lr_ratio;
  const double span = static_cast<double>(std::max<std::int64_t>(1, total - s.warmup));
  const double p = std::min(1.0, static_cast<double>(k - s.warmup) / span);
  if (s.type == "linear") return std::max(m, 1.0 - (1.0 - m) * p);
  if (s.type == "cosine") return m + (1.0 - m) * 0.5 * (1.0 + std::cos(M_PI * p));
  if (s.type == "step") return std::pow(s.gamma, static_cast<double>((k - s.warmup) / std::max<std::int64_t>(1, s.step_size)));
  return 1.0;
}

}  // namespace refit
