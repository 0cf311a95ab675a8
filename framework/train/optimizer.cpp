#include "train/optimizer.h"

#include <cmath>
#include <optional>

#include <ATen/ATen.h>

#include "refit/error.h"

namespace refit {

Optimizer::Optimizer(OptimizerSpec spec, std::vector<ParameterGroup> groups)
    : spec_(std::move(spec)), groups_(std::move(groups)) {
  for (const auto& g : groups_) {
    lr_.push_back(g.lr);
    state_.emplace_back(g.parameters.size());
  }
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, const std::vector<ParameterGroup>& groups) {
  return std::make_unique<Optimizer>(spec, groups);
}

void Optimizer::set_lr(std::size_t group, double lr) {
  if (!lr_device_.empty() && lr != lr_.at(group)) lr_device_[group].fill_(lr);  // a kernel only on change
  lr_.at(group) = lr;
}

void Optimizer::use_device_lr() {
  lr_device_.clear();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    // The fused CUDA kernels want the lr on the parameters' own device, as float32.
    const auto& ps = groups_[g].parameters;
    const torch::Device device = ps.empty() ? torch::Device(torch::kCPU) : ps.front().device();
    lr_device_.push_back(torch::full({}, lr_[g], torch::TensorOptions().dtype(torch::kFloat).device(device)));
  }
}

void Optimizer::ensure_fused_state(const torch::Tensor& param, ParamState& s) {
  if (!s.exp_avg.defined()) {
    s.exp_avg = at::zeros_like(param, at::MemoryFormat::Preserve);
    s.exp_avg_sq = at::zeros_like(param, at::MemoryFormat::Preserve);
  }
  if (!s.step_t.defined())
    s.step_t = torch::full({}, s.step, torch::TensorOptions().dtype(torch::kFloat).device(param.device()));
}

void Optimizer::materialize_state() {
  if (!skips_on_device()) return;
  at::NoGradGuard no_grad;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t p = 0; p < groups_[g].parameters.size(); ++p)
      if (groups_[g].parameters[p].grad().defined()) ensure_fused_state(groups_[g].parameters[p], state_[g][p]);
}

void Optimizer::step(const torch::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  const bool fused = skips_on_device();
  // The unfused paths are written op for op on host scalars: they read the flag (a host sync).
  if (!fused && found_inf.defined() && found_inf.item<float>() != 0.0f) return;
  // The fused kernels' skip flag and step increment, made once per device, not per group.
  FusedSkip skip;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (fused) {
      fused_update(g, found_inf, skip);
      continue;
    }
    for (std::size_t p = 0; p < groups_[g].parameters.size(); ++p) {
      const auto& param = groups_[g].parameters[p];
      if (param.grad().defined()) update(groups_[g], lr_[g], param, state_[g][p]);
    }
  }
}

// torch/optim/adam.py `_fused_adam` (fused=True): steps += 1, then one kernel over the group;
// with found_inf (GradScaler.step on a fused optimizer) the kernel leaves parameters and moments
// alone when it is set, and the step counts are left as they were.
void Optimizer::fused_update(std::size_t g, const torch::Tensor& found_inf, FusedSkip& skip) {
  const ParameterGroup& group = groups_[g];
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  for (std::size_t p = 0; p < group.parameters.size(); ++p) {
    const auto& param = group.parameters[p];
    if (!param.grad().defined()) continue;
    ParamState& s = state_[g][p];
    ensure_fused_state(param, s);
    params.push_back(param);
    grads.push_back(param.grad());
    exp_avgs.push_back(s.exp_avg);
    exp_avg_sqs.push_back(s.exp_avg_sq);
    steps.push_back(s.step_t);
  }
  if (params.empty()) return;
  const auto [beta1, beta2] = group.betas;
  std::optional<torch::Tensor> inf;
  if (found_inf.defined()) {
    const torch::Device device = params.front().device();
    if (!skip.inf.defined() || skip.inf.device() != device) {
      skip.inf = found_inf.to(device, torch::kFloat).reshape({1});
      skip.advance = skip.inf.reshape({}).neg().add(1);
    }
    inf = skip.inf;
    // PyTorch adds 1 before the kernel and takes found_inf back off after it; a skipped kernel
    // reads no step, so adding 1 - found_inf once before it leaves the same counts in one op.
    at::_foreach_add_(steps, skip.advance);
  } else {
    at::_foreach_add_(steps, 1);
  }
  const bool adamw = spec_.type == "adamw";
  auto run = [&](const auto& lr) {  // lr: a device tensor (use_device_lr) or a number
    if (adamw)
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, lr, beta1, beta2, group.weight_decay, group.eps,
                        /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, inf);
    else
      at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, lr, beta1, beta2, group.weight_decay, group.eps,
                       false, false, std::nullopt, inf);
  };
  if (lr_device_.empty()) run(lr_[g]);
  else
    run(lr_device_[g]);
}

// Op for op torch/optim/adam.py `_single_tensor_adam` (decoupled weight decay for AdamW) and
// torch/optim/sgd.py `_single_tensor_sgd` (dampening 0), PyTorch 2.11.
void Optimizer::update(const ParameterGroup& g, double lr, const torch::Tensor& param, ParamState& s) {
  torch::Tensor grad = param.grad();
  const double wd = g.weight_decay;
  if (spec_.type == "sgd") {
    if (wd != 0) grad = grad.add(param, wd);
    if (spec_.momentum != 0) {
      if (!s.momentum_buffer.defined()) s.momentum_buffer = grad.clone().detach();
      else
        s.momentum_buffer.mul_(spec_.momentum).add_(grad, 1.0);
      grad = spec_.nesterov ? grad.add(s.momentum_buffer, spec_.momentum) : s.momentum_buffer;
    }
    param.add_(grad, -lr);
    s.step += 1;
    return;
  }
  if (!s.exp_avg.defined()) {
    s.exp_avg = at::zeros_like(param, at::MemoryFormat::Preserve);
    s.exp_avg_sq = at::zeros_like(param, at::MemoryFormat::Preserve);
  }
  s.step += 1;
  if (wd != 0) {
    if (spec_.type == "adamw") param.mul_(1 - lr * wd);
    else
      grad = grad.add(param, wd);
  }
  const double beta1 = g.betas.first, beta2 = g.betas.second;
  s.exp_avg.lerp_(grad, 1 - beta1);
  s.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  const double bias_correction1 = 1 - std::pow(beta1, s.step);
  const double bias_correction2 = 1 - std::pow(beta2, s.step);
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  auto denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(g.eps);
  param.addcdiv_(s.exp_avg, denom, -step_size);
}

void Optimizer::zero_grad(bool set_to_none) {
  std::vector<torch::Tensor> grads;
  for (auto& g : groups_)
    for (auto& p : g.parameters) {
      if (!p.grad().defined()) continue;
      if (set_to_none) p.mutable_grad() = torch::Tensor();
      else
        grads.push_back(p.grad());
    }
  if (!grads.empty()) at::_foreach_zero_(grads);
}

std::map<std::string, torch::Tensor> Optimizer::state_dict() const {
  std::map<std::string, torch::Tensor> out;
  for (std::size_t g = 0; g < state_.size(); ++g) {
    out["group" + std::to_string(g) + ".lr"] = torch::tensor(lr_[g], torch::kDouble);
    for (std::size_t p = 0; p < state_[g].size(); ++p) {
      const auto& s = state_[g][p];
      const std::string k = "group" + std::to_string(g) + ".param" + std::to_string(p) + ".";
      out[k + "step"] =
          s.step_t.defined() ? s.step_t.to(torch::kCPU, torch::kDouble) : torch::tensor(s.step, torch::kDouble);
      if (s.exp_avg.defined()) out[k + "exp_avg"] = s.exp_avg;
      if (s.exp_avg_sq.defined()) out[k + "exp_avg_sq"] = s.exp_avg_sq;
      if (s.momentum_buffer.defined()) out[k + "momentum_buffer"] = s.momentum_buffer;
    }
  }
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, torch::Tensor>& state) {
  at::NoGradGuard no_grad;
  auto get = [&](const std::string& k) -> torch::Tensor {
    auto it = state.find(k);
    return it == state.end() ? torch::Tensor() : it->second;
  };
  // One finite number >= 0 (an integer for a step count). item() on another shape threw
  // c10::Error; a NaN or negative rate or step would have trained on silently.
  auto number = [&](const torch::Tensor& t, const std::string& key, bool integer) {
    if (t.numel() != 1)
      throw Error("optimizer state " + key + " holds " + std::to_string(t.numel()) + " values, not one (a damaged file?)");
    const double v = t.item<double>();
    if (!std::isfinite(v) || v < 0 || (integer && v != std::floor(v)))
      throw Error("optimizer state " + key + " is " + std::to_string(v) + ", not a finite " +
                  (integer ? "integer" : "number") + " >= 0 (a damaged file?)");
    return v;
  };
  // Everything is checked before anything changes.
  std::vector<double> lrs(state_.size());
  std::vector<std::vector<double>> steps(state_.size());
  for (std::size_t g = 0; g < state_.size(); ++g) {
    const std::string lr_key = "group" + std::to_string(g) + ".lr";
    auto lr = get(lr_key);
    if (!lr.defined()) throw Error("optimizer state has no group " + std::to_string(g) + " (different parameter groups?)");
    lrs[g] = number(lr, lr_key, false);
    for (std::size_t p = 0; p < state_[g].size(); ++p) {
      const std::string k = "group" + std::to_string(g) + ".param" + std::to_string(p) + ".";
      auto step = get(k + "step");
      if (!step.defined()) throw Error("optimizer state has no entry " + k + "step (different parameters?)");
      steps[g].push_back(number(step, k + "step", true));
      for (const char* name : {"exp_avg", "exp_avg_sq", "momentum_buffer"}) {
        auto t = get(k + name);
        if (t.defined() && t.sizes() != groups_[g].parameters[p].sizes())
          throw Error("optimizer state " + k + name + " does not match its parameter's shape");
      }
    }
  }
  for (std::size_t g = 0; g < state_.size(); ++g) {
    set_lr(g, lrs[g]);
    for (std::size_t p = 0; p < state_[g].size(); ++p) {
      const std::string k = "group" + std::to_string(g) + ".param" + std::to_string(p) + ".";
      auto& s = state_[g][p];
      const auto& param = groups_[g].parameters[p];
      s.step = steps[g][p];
      s.step_t = torch::Tensor();  // recreated from s.step by the fused path
      auto restore = [&](const char* name, torch::Tensor& dst) {
        auto t = get(k + name);
        if (t.defined()) dst = t.to(param.device(), param.scalar_type()).clone();
      };
      restore("exp_avg", s.exp_avg);
      restore("exp_avg_sq", s.exp_avg_sq);
      restore("momentum_buffer", s.momentum_buffer);
    }
  }
}

}  // namespace refit
