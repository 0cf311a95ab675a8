#include "train/best_weights.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "refit/error.h"

namespace refit {

std::vector<std::pair<std::string, torch::Tensor>> BestWeights::targets() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& m : models_.models())
    for (const auto& p : m.parameters)
      if (p.changes_in_training()) out.emplace_back(m.spec.name + "/" + p.path, p.tensor);
  return out;
}

void BestWeights::keep(std::int64_t step) {
  torch::NoGradGuard no_grad;
  StateDict copies;
  for (const auto& [key, tensor] : targets()) copies[key] = tensor.detach().clone();
  copies_ = std::move(copies);
  step_ = step;
}

bool BestWeights::restore() {
  if (copies_.empty()) return false;
  torch::NoGradGuard no_grad;
  for (const auto& [key, tensor] : targets()) tensor.copy_(copies_.at(key));
  return true;
}

StateDict BestWeights::state_dict() const {
  if (copies_.empty()) return {};
  StateDict s = copies_;
  s["step"] = torch::tensor(step_, torch::kLong);
  return s;
}

void BestWeights::load_state_dict(const StateDict& state) {
  const auto step = state.find("step");
  if (step == state.end() || step->second.numel() != 1 || step->second.scalar_type() != torch::kLong)
    throw Error("checkpoint: the best weights' state has no int64 \"step\" (a damaged file?)");
  StateDict copies;
  for (const auto& [key, tensor] : targets()) {
    const auto it = state.find(key);
    if (it == state.end()) throw Error("checkpoint: the best weights lack " + key + " (another model?)");
    if (it->second.sizes() != tensor.sizes())
      throw Error("checkpoint: the best weights' " + key + " has shape " + c10::str(it->second.sizes()) + ", the model's " +
                  c10::str(tensor.sizes()));
    if (it->second.is_floating_point() && !torch::isfinite(it->second).all().item<bool>())
      throw Error("checkpoint: the best weights' " + key + " holds NaN or infinity (a damaged file?)");
    copies[key] = it->second.to(tensor.device(), tensor.scalar_type());
  }
  copies_ = std::move(copies);
  step_ = step->second.item<std::int64_t>();
}

}  // namespace refit
