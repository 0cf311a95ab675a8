#include "evaluators/evaluators.h"

namespace refit {

void register_knn_evaluator(Registry& registry);           // knn.cpp
void register_linear_probe_evaluator(Registry& registry);  // linear_probe.cpp

void register_builtin_evaluators(Registry& registry) {
  register_knn_evaluator(registry);
  register_linear_probe_evaluator(registry);
}

}  // namespace refit
