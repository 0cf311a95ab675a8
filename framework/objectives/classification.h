#pragma once
#include "refit/registry.h"

namespace refit {

/// Registers the built-in "classification" objective: the input runs through the listed models
/// in order (e.g. ["backbone", "head"]); loss = cross entropy (optionally label-smoothed), metric
/// "accuracy".
void register_classification_objective(Registry& registry);

}  // namespace refit
