// Registers a model name that test-good also registers.
#include "refit/plugin.h"

namespace {
void register_duplicate(refit::Registry& r) {
  r.models.add("test_net", "clashes with test-good", [](const refit::ConfigReader&) -> refit::Builder<refit::Model> {
    return [](const refit::BuildContext&) -> refit::ModelPtr { return nullptr; };
  });
}
}  // namespace

REFIT_PLUGIN("test-duplicate", "0.0.1", register_duplicate)
