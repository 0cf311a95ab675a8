#include "precision/grad_scaler.h"

#include <cmath>

#include "refit/error.h"

#include <ATen/ATen.h>

namespace refit {

GradScaler::GradScaler(GradScalerOptions options, torch::Device device) : options_(options) {
  auto f32 = torch::TensorOptions().device(device).dtype(torch::kFloat);
  scale_ = torch::full({1}, options_.enabled ? options_.init_scale : 1.0, f32);
  growth_tracker_ = torch::zeros({1}, f32.dtype(torch::kInt));
  found_inf_ = torch::zeros({1}, f32);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_;  // type promotion as in torch.amp.GradScaler.scale
}

void GradScaler::unscale(const std::vector<torch::Tensor>& grads) {
  found_inf_.zero_();
  if (grads.empty()) return;
  if (!options_.enabled) return;
  auto inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  // The kernel requires gradients of one device; it handles mixed dtypes per tensor.
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale);
}

void GradScaler::record_found_inf(const torch::Tensor& non_finite) {
  found_inf_.copy_(non_finite.to(torch::kFloat).reshape({1}));
}

void GradScaler::update() {
  if (!options_.enabled) return;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
}

StateDict GradScaler::state_dict() const { return {{"scale", scale_}, {"growth_tracker", growth_tracker_}}; }

void GradScaler::load_state_dict(const StateDict& state) {
  auto scale = state.find("scale"), growth = state.find("growth_tracker");
  if (scale == state.end() || growth == state.end())
    throw Error("gradient scaler state: expected \"scale\" and \"growth_tracker\"");
  if (scale->second.numel() != 1 || growth->second.numel() != 1)
    throw Error("gradient scaler state: \"scale\" and \"growth_tracker\" must hold one value each");
  // A NaN, infinite or negative scale would skip or corrupt every later step. (0 is reachable,
  // if hardly useful: a scale halved by ~170 non-finite windows in a row.)
  const double scale_value = scale->second.item<double>(), growth_value = growth->second.item<double>();
  if (!std::isfinite(scale_value) || scale_value < 0)
    throw Error("gradient scaler state: \"scale\" is " + std::to_string(scale_value) +
                ", not a finite number >= 0 (a damaged file?)");
  if (!std::isfinite(growth_value) || growth_value < 0 || growth_value != std::floor(growth_value))
    throw Error("gradient scaler state: \"growth_tracker\" is " + std::to_string(growth_value) +
                ", not an integer >= 0 (a damaged file?)");
  scale_.copy_(scale->second.reshape_as(scale_));
  growth_tracker_.copy_(growth->second.reshape_as(growth_tracker_));
}

}  // namespace refit
