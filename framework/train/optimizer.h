#pragma once
// Builds the optimizer from the registry's parameter groups; every group's overrides (lr, weight
// decay, betas, eps) land in that group's own options.
#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>

#include "core/recipe.h"
#include "model/model_registry.h"

namespace refit {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<ParameterGroup>& groups);

/// Sets group i's learning rate (the schedule's output).
void set_learning_rate(torch::optim::Optimizer& opt, std::size_t group, double lr);
double get_learning_rate(const torch::optim::Optimizer& opt, std::size_t group);

}  // namespace refit
