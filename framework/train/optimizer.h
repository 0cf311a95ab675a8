#pragma once
// refit's optimizers: SGD (momentum, nesterov), Adam, AdamW. Adam/AdamW run as one ATen fused
// kernel per parameter group by default (`fused`), or op for op as below. Written out rather than taken from
// torch::optim so that (1) the arithmetic is PyTorch's own single-tensor path op for op (golden
// tests compare against Python to 1e-6), (2) the state is a flat name -> tensor map that
// checkpoints store as safetensors, and (3) fused kernels can take over later without changing
// callers. Parameter groups come from the model registry with every override resolved.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "core/recipe.h"
#include "model/model_registry.h"
#include "refit/state.h"

namespace refit {

class Optimizer : public Stateful {
 public:
  Optimizer(OptimizerSpec spec, std::vector<ParameterGroup> groups);

  /// One update of every parameter that has a gradient. With `found_inf` (a float [1] device
  /// tensor, 1.0 = the window's gradients were not finite) the update is skipped when it is set:
  /// fused Adam/AdamW decide on the device (ATen's kernels take found_inf, as torch.amp does for
  /// fused optimizers), so no host synchronisation happens; the other paths read it once.
  void step(const torch::Tensor& found_inf = {});
  /// True when step(found_inf) decides on the device (no host read).
  bool skips_on_device() const { return spec_.fused && (spec_.type == "adamw" || spec_.type == "adam"); }
  /// Gradients set to none, or (set_to_none false) zeroed in place: a captured CUDA graph
  /// accumulates into the same gradient buffers every replay.
  void zero_grad(bool set_to_none = true);

  std::size_t group_count() const { return groups_.size(); }
  const ParameterGroup& group(std::size_t i) const { return groups_.at(i); }
  double lr(std::size_t group) const { return lr_.at(group); }
  void set_lr(std::size_t group, double lr);
  /// Sets the host's value only (lr(), checkpoints, reports), leaving the device tensor alone:
  /// for a schedule that writes device_lr() itself on the device (train/schedule.h).
  void set_host_lr(std::size_t group, double lr) { lr_.at(group) = lr; }
  /// The group's learning rate as the fused kernels read it (after use_device_lr()).
  torch::Tensor& device_lr(std::size_t group) { return lr_device_.at(group); }
  bool has_device_lr() const { return !lr_device_.empty(); }
  /// Keeps each group's learning rate in a float32 tensor on its parameters' device as well, which the fused
  /// kernels read instead of a number baked into their launch: a step captured as a CUDA graph
  /// then follows the schedule (set_lr writes the tensor with a kernel; no host sync).
  void use_device_lr();
  /// Creates now the fused path's per-parameter state (moments, step count) for every parameter
  /// that has a gradient, instead of lazily in the first step(): a step captured as a CUDA graph
  /// must find its state, not record its creation (which every replay would repeat).
  void materialize_state();
  const OptimizerSpec& spec() const { return spec_; }

  /// State as "group<g>.param<p>.<name>" -> tensor (exp_avg, exp_avg_sq, momentum_buffer, step).
  StateDict state_dict() const override;
  /// Restores a state_dict() of an optimizer over the same groups; throws refit::Error on mismatch.
  void load_state_dict(const StateDict& state) override;

 private:
  struct ParamState {
    double step = 0;
    torch::Tensor step_t;  // the fused kernels keep the step count in a tensor
    torch::Tensor exp_avg, exp_avg_sq, momentum_buffer;
  };
  void update(const ParameterGroup& g, double lr, const torch::Tensor& param, ParamState& s);
  struct FusedSkip {
    torch::Tensor inf, advance;  // found_inf as the kernels take it, and 1 - found_inf
  };
  void fused_update(std::size_t group, const torch::Tensor& found_inf, FusedSkip& skip);
  void ensure_fused_state(const torch::Tensor& param, ParamState& s);

  OptimizerSpec spec_;
  std::vector<ParameterGroup> groups_;
  std::vector<double> lr_;
  std::vector<torch::Tensor> lr_device_;  // empty unless use_device_lr()
  std::vector<std::vector<ParamState>> state_;
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, const std::vector<ParameterGroup>& groups);

}  // namespace refit
