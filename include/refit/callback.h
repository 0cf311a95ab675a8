#pragma once
// Callbacks observe the training loop through const views; the only way to steer it is the
// explicit TrainerControl. Hooks are called in the order documented in docs/training-loop.md.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/collectives.h"
#include "refit/state.h"
#include "refit/step_graph_support.h"

namespace refit {

/// Where the loop is. `step` counts micro-batches (forward+backward), `iteration` counts
/// optimizer updates attempted (one per accumulation window, skipped ones included).
struct Counters {
  std::int64_t step = 0;
  std::int64_t iteration = 0;
  std::int64_t epoch = 0;
  std::int64_t samples = 0;
  std::int64_t skipped_iterations = 0;
};

/// What one micro-batch step produced. Tensors stay on the device: reading them (`.item()`) is
/// the reader's choice and the only host sync; the loop itself never reads them.
struct StepResult {
  Counters counters;
  torch::Tensor loss;            // unscaled mean loss of this micro-batch
  std::int64_t count = 0;        // samples (or tokens) in this micro-batch
  bool window_complete = false;  // an optimizer update was attempted after this step
  // The fields below are set when window_complete:
  torch::Tensor grad_norm_before;      // unscaled total L2 norm before clipping
  torch::Tensor grad_norm_after;       // after clipping: before x the clip coefficient (same when clipping is off)
  torch::Tensor scale_before;          // loss scale used for this window (1 without a scaler)
  torch::Tensor scale_after;           // after scaler.update()
  torch::Tensor skipped;               // bool: gradients were non-finite and the update was skipped
  std::string skip_reason;             // "non-finite gradients" when known on the host
  std::vector<double> learning_rates;  // per parameter group, as used by this update
};

/// Evaluation results: metric name -> mean over the evaluation set.
struct EvalResult {
  std::string split = "val";  // which data set ("val", "test")
  Counters counters;
  std::map<std::string, double> metrics;
  std::int64_t count = 0;
};

/// The loop's public state, handed to every hook.
struct TrainState {
  Counters counters;
  std::int64_t max_steps = 0;       // total micro-batch steps this run will take
  std::int64_t max_iterations = 0;  // total optimizer updates (windows) this run will attempt
  std::int64_t steps_per_epoch = 0;
  /// Data-parallel runs: sums over the ranks (refit/collectives.h); null in one process.
  Collectives* collectives = nullptr;
};

/// The only way a callback influences the loop.
class TrainerControl {
 public:
  void request_stop() { stop_ = true; }
  void request_evaluation() { evaluate_ = true; }
  void request_checkpoint() { checkpoint_ = true; }
  bool stop_requested() const { return stop_; }
  bool evaluation_requested() const { return evaluate_; }
  bool checkpoint_requested() const { return checkpoint_; }
  void clear_requests() { evaluate_ = checkpoint_ = false; }

 private:
  bool stop_ = false, evaluate_ = false, checkpoint_ = false;
};

/// Callbacks are Stateful: one whose state a resume needs returns it from state_dict(); it is
/// saved in checkpoints under "callback/<position in the run's callback list>".
class Callback : public Stateful {
 public:
  virtual void on_train_begin(const TrainState&, TrainerControl&) {}
  virtual void on_train_end(const TrainState&, TrainerControl&) {}
  virtual void on_epoch_begin(const TrainState&, TrainerControl&) {}
  virtual void on_epoch_end(const TrainState&, TrainerControl&) {}
  virtual void on_step_begin(const TrainState&, TrainerControl&) {}
  virtual void on_compute_loss_begin(const TrainState&, TrainerControl&) {}
  virtual void on_compute_loss_end(const TrainState&, TrainerControl&) {}
  virtual void on_backward_begin(const TrainState&, TrainerControl&) {}
  virtual void on_backward_end(const TrainState&, TrainerControl&) {}
  /// Gradients are unscaled and not yet clipped.
  virtual void on_before_optimizer_step(const TrainState&, TrainerControl&) {}
  virtual void on_optimizer_step_end(const TrainState&, const StepResult&, TrainerControl&) {}
  virtual void on_step_end(const TrainState&, const StepResult&, TrainerControl&) {}
  virtual void on_evaluation_begin(const TrainState&, TrainerControl&) {}
  virtual void on_evaluation_end(const TrainState&, const EvalResult&, TrainerControl&) {}
  virtual void on_checkpoint_saved(const TrainState&, const std::string& /*dir*/, TrainerControl&) {}
  /// A callback's part in a step captured as a CUDA graph (refit/step_graph_support.h): its hooks
  /// run outside the step, so it allows replays unless it needs the hooks inside the step.
  virtual StepGraphSupport step_graph_support() const { return {/*replayable=*/true, /*inner_step_hooks=*/false}; }
};

using CallbackPtr = std::shared_ptr<Callback>;

}  // namespace refit
