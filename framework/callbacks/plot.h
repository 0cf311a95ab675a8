#pragma once
// A picture of a run a person can open after it: loss (train and val), learning rate, grad norm
// (before and after clipping, skipped updates marked) and loss scale, one panel each, as a
// self-contained SVG drawn from the run's metrics.jsonl.
#include <filesystem>

namespace refit {

/// Reads `metrics_jsonl` and writes `svg`. Throws refit::Error when the log cannot be read.
void write_training_plot(const std::filesystem::path& metrics_jsonl, const std::filesystem::path& svg);

}  // namespace refit
