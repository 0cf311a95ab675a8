#pragma once
// `refit inspect RECIPE [--parameters]`: the models as registered, before any training.
#include <string>

#include "run/assembly.h"

namespace refit::cli {

/// A table per model and adapter: parameters, trainable ones, dtypes, device, and the memory of
/// weights, gradients and optimizer state; with `parameters`, then one line per parameter
/// (model, path, trainable, dtype, shape, optimizer group, declaring adapter).
std::string inspect(const Assembly& assembly, bool parameters = false);

}  // namespace refit::cli
