#pragma once
// Learning-rate schedules as pure functions of the optimizer iteration (unit-tested without a
// model). Semantics follow HF transformers' get_*_schedule_with_warmup: the factor applied to
// the base learning rate at 0-based iteration k is
//   warmup (k < W):  k / W
//   constant:        1
//   linear:          max(m, 1 - (1-m) * p)        p = (k - W) / (T - W)
//   cosine:          m + (1-m) * 0.5 * (1 + cos(pi * p))
//   step:            gamma ^ floor((k - W) / step_size)
// where T is the run's total number of iterations and m is min_lr_ratio.
#include <cstdint>

#include "core/recipe.h"

namespace refit {

double lr_factor(const SchedulerSpec& spec, std::int64_t iteration, std::int64_t total_iterations);

}  // namespace refit
