#pragma once
// The DINO self-distillation objective (Caron et al. 2021). The student (a chain of registered
// models, e.g. backbone + DINO head) sees every view of a multi-crop batch; the teacher (a chain of
// EMA models of the student's, declared in /models with "ema") sees the global crops only, under
// no_grad. loss = dino_loss (dino_loss.h). The centre moves towards the mean of the teacher's
// outputs once per optimizer update, over the whole accumulation window (k micro-batches move it
// as one k-times-larger batch would), and not at all when the update is skipped: training
// forwards add the teacher's outputs to window sums, and the objective, also a Callback (the loop
// gives an objective that is one its hooks), applies them at on_optimizer_step_end, where
// StepResult::skipped says whether the update happened. Centre and window sums are checkpointed
// (Objective's Stateful state).
#include <string>
#include <vector>

#include "refit/callback.h"
#include "refit/config.h"
#include "refit/objective.h"

namespace refit::dino {

struct DinoObjectiveOptions {
  std::vector<std::string> student, teacher;  // model chains: first model per crop size, the rest on all
  std::int64_t global_crops = 0;              // how many global crops the data must make; 0: as it makes
  double student_temperature = 0.1;
  double teacher_temperature = 0.04;  // after warm-up
  double warmup_teacher_temperature = 0.04;
  std::int64_t warmup_teacher_temperature_iterations = 0;
  double center_momentum = 0.9;
  static DinoObjectiveOptions from_config(const ConfigReader& c);
};

class DinoObjective : public Objective, public Callback {
 public:
  explicit DinoObjective(DinoObjectiveOptions options) : options_(std::move(options)) {}
  std::vector<std::string> required_models() const override;
  std::vector<std::string> required_fields(const ModelMap& models) const override;
  LossOutput compute(const ModelMap& models, const Batch& batch, const ObjectiveContext& context) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  /// The centre moves in place and the teacher temperature is read from a device tensor written
  /// between steps (prepare_step), so a captured step stays right when replayed.
  StepGraphSupport step_graph_support() const override { return {/*replayable=*/true, /*inner_step_hooks=*/false}; }
  void prepare_step(const ObjectiveContext& context) override;
  /// The loop's events reach the objective (the centre moves at on_optimizer_step_end).
  Callback* loop_hooks() override { return this; }
  /// The window's centre update, unless the update was skipped (a device-side where: no host read).
  void on_optimizer_step_end(const TrainState& state, const StepResult& result, TrainerControl& control) override;
  /// The centre's window sums are summed over the ranks before each move.
  bool reduces_state_across_ranks() const override { return true; }

 private:
  /// Writes the teacher temperature at `iteration` into temperature_ when it changes (a kernel,
  /// no host read). Called by prepare_step, and by compute() for callers that do not call
  /// prepare_step; during a capture prepare_step has already written it, so nothing is recorded.
  void set_temperature(std::int64_t iteration);
  DinoObjectiveOptions options_;
  torch::Tensor center_;       // [1, K] fp32 on the device; created at the first forward unless restored
  torch::Tensor window_sum_;   // [1, K] fp32: the teacher outputs of this window's training forwards, summed
  torch::Tensor window_rows_;  // 0-d fp32: how many rows window_sum_ holds
  torch::Tensor temperature_;  // 0-d fp32 on the device: the teacher temperature of this step
  double temperature_value_ = -1;
};

}  // namespace refit::dino
