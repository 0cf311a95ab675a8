#pragma once
// Dynamic loss scaling for fp16, the algorithm of torch.amp.GradScaler, on ATen's own kernels
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_). State stays on the device:
// nothing here synchronises with the host.
#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "refit/state.h"

namespace refit {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler : public Stateful {
 public:
  GradScaler(GradScalerOptions options, torch::Device device);

  /// loss * scale (identity when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Unscales the gradients in place and records whether any was inf/NaN. Once per window.
  /// Disabled (bf16/fp32): does nothing; the caller records found_inf from the grad norm.
  void unscale(const std::vector<torch::Tensor>& grads);
  /// Sets found_inf from a bool tensor (the non-finite check of runs without loss scaling).
  void record_found_inf(const torch::Tensor& non_finite);
  /// Adjusts the scale from the recorded found_inf; resets it. Once per window.
  void update();

  const torch::Tensor& scale_tensor() const { return scale_; }             // fp32 [1]
  const torch::Tensor& growth_tracker() const { return growth_tracker_; }  // int32 [1]
  const torch::Tensor& found_inf() const { return found_inf_; }            // fp32 [1], 1.0 = non-finite
  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  /// For checkpoints: "scale" and "growth_tracker".
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  GradScalerOptions options_;
  torch::Tensor scale_, growth_tracker_, found_inf_;
};

}  // namespace refit
