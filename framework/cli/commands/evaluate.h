#pragma once
// `refit evaluate RECIPE [--checkpoint DIR] [--split val|test]`: scores trained weights exactly
// as training does.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "refit/callback.h"
#include "run/assembly.h"

namespace refit::cli {

/// Restores the trainable weights of `checkpoint` (default: the run's latest) and evaluates them
/// on `split` as the training loop does (train/evaluation.h) — "val": the objective on /data/val
/// and every evaluator (a validation); "test": the objective on /data/test. Builds only the
/// models, the split's data and the evaluators. Prints one line to `out` and returns the result.
EvalResult evaluate(const Assembly& assembly, const std::optional<std::filesystem::path>& checkpoint,
                    const std::string& split, std::FILE* out);

}  // namespace refit::cli
