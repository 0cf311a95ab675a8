#pragma once
// `refit train RECIPE`: builds everything the recipe describes, trains, and writes the run folder.
#include <cstdio>
#include <vector>

#include "refit/callback.h"
#include "run/assembly.h"
#include "train/trainer.h"

namespace refit::cli {

/// Trains the assembled recipe; progress goes to `out`. `extra` callbacks run after the recipe's
/// (benchmarks and embedding programs observe the loop through them). Rank 0 of a data-parallel
/// run writes summary.json, training.svg and report.html into the run folder.
TrainSummary train(const Assembly& assembly, std::FILE* out, std::vector<CallbackPtr> extra = {});

}  // namespace refit::cli
