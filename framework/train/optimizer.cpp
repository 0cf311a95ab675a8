#include "train/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace refit {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<ParameterGroup>& groups) {
  using namespace torch::optim;
  std::vector<OptimizerParamGroup> param_groups;
  for (const auto& g : groups) {
    std::unique_ptr<OptimizerOptions> options;
    if (spec.type == "adamw") {
      options = std::make_unique<AdamWOptions>(AdamWOptions(g.lr)
                                                   .betas({g.betas.first, g.betas.second})
                                                   .eps(g.eps)
                                                   .weight_decay(g.weight_decay));
    } else if (spec.type == "adam") {
      options = std::make_unique<AdamOptions>(
          AdamOptions(g.lr).betas({g.betas.first, g.betas.second}).eps(g.eps).weight_decay(g.weight_decay));
    } else {
      options = std::make_unique<SGDOptions>(
          SGDOptions(g.lr).momentum(spec.momentum).nesterov(spec.nesterov).weight_decay(g.weight_decay));
    }
    param_groups.emplace_back(g.parameters, std::move(options));
  }
  if (spec.type == "adamw") return std::make_unique<AdamW>(std::move(param_groups), AdamWOptions(spec.lr));
  if (spec.type == "adam") return std::make_unique<Adam>(std::move(param_groups), AdamOptions(spec.lr));
  return std::make_unique<SGD>(std::move(param_groups), SGDOptions(spec.lr));
}

void set_learning_rate(torch::optim::Optimizer& opt, std::size_t group, double lr) {
  opt.param_groups().at(group).options().set_lr(lr);
}

double get_learning_rate(const torch::optim::Optimizer& opt, std::size_t group) {
  return opt.param_groups().at(group).options().get_lr();
}

}  // namespace refit
