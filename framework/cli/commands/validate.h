#pragma once
// `refit validate RECIPE`: everything `refit train` would check before its first step.
#include "run/assembly.h"

namespace refit::cli {

/// Beyond the recipe (checked by the Assembly): builds the models (the registry's dtype and
/// precision checks) and the data, and checks that every field the objective and evaluators read
/// is produced. Throws on the first failure to build, or a ConfigError with every missing field.
void validate(const Assembly& assembly);

}  // namespace refit::cli
