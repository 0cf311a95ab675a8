#pragma once
// Updates EMA models (recipe: a model with "ema": {"of": ...}) after every optimizer update:
//   ema = m * ema + (1 - m) * source,   m = momentum schedule at the update's iteration,
// for an update that was skipped (non-finite gradients) m is 1: the copy stays as it was. The
// decision stays on the device (m is a 0-d tensor built from StepResult::skipped), so the
// update adds no host synchronisation to the step.
#include <vector>

#include "model/model_registry.h"
#include "refit/callback.h"

namespace refit {

/// Momentum of an EMA update at optimizer iteration `iteration` (0-based) of `total`:
/// cosine from `momentum` to `final_momentum` (DINO's teacher schedule), or constant.
double ema_momentum(const EmaSpec& spec, std::int64_t iteration, std::int64_t total);

class EmaCallback : public Callback {
 public:
  /// Tracks every EMA model of `models` (which must outlive the callback).
  explicit EmaCallback(const ModelRegistry& models);
  bool empty() const { return tracks_.empty(); }
  void on_optimizer_step_end(const TrainState& state, const StepResult& result, TrainerControl&) override;

 private:
  struct Track {
    EmaSpec spec;
    std::vector<torch::Tensor> ema, source;
  };
  std::vector<Track> tracks_;
};

}  // namespace refit
