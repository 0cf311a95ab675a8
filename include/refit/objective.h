#pragma once
// An objective computes the loss (and metrics) of a batch from the registered models.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/callback.h"
#include "refit/dataset.h"
#include "refit/model.h"
#include "refit/state.h"

namespace refit {

/// Sums, not means: the loop divides by Objective::count() of the whole accumulation window (or of
/// the whole evaluation set), counted on the host batches before they move to the device, so k
/// micro-batches equal one k-times-larger batch.
struct LossOutput {
  torch::Tensor loss_sum;                            // 0-d, fp32, differentiable
  std::int64_t count = 0;                            // samples (or tokens) the sum is over, as compute saw them;
                                                     // the loops divide by count(batch) of the host batch
  std::map<std::string, torch::Tensor> metric_sums;  // 0-d device tensors, e.g. "accuracy"
};

/// Where the loop is when it asks for a loss. Schedules inside an objective (a temperature
/// warm-up) read `state.counters.iteration` and `state.max_iterations`; state that an objective
/// updates from batches (a running centre) is updated only when `training` is true.
struct ObjectiveContext {
  const TrainState& state;
  bool training = true;
};

class Objective : public Stateful {
 public:
  virtual ~Objective() = default;
  /// Names of the registered models this objective reads (checked by `refit validate`).
  virtual std::vector<std::string> required_models() const = 0;
  /// The data fields compute() reads, given the built models (their inputs and the recipe's
  /// renaming of them): `refit validate` checks each against what the training and validation
  /// data produce. Objectives that read fields themselves ("labels") add them to the chain's.
  virtual std::vector<std::string> required_fields(const ModelMap& models) const {
    return chain_fields(models, required_models());
  }
  virtual LossOutput compute(const ModelMap& models, const Batch& batch, const ObjectiveContext& context) = 0;
  /// How many samples/tokens a batch contributes (known before the forward, so that a window's
  /// normaliser is known before its first backward).
  virtual std::int64_t count(const Batch& batch) const { return batch.size(); }
  /// The names of the metric sums compute() reports ("accuracy"), besides the loss: `refit
  /// validate` refuses an evaluator that would report the same name.
  virtual std::vector<std::string> metric_names() const { return {}; }
  /// Metrics that are functions of a whole evaluation's means rather than means of per-batch
  /// sums (a language model's perplexity is exp of the mean token loss, not a mean of
  /// exponentials): called with the evaluation's "loss" and metric means, adds entries to them.
  /// Their names belong in metric_names() too. Default: none.
  virtual void add_derived_metrics(std::map<std::string, double>& means) const { (void)means; }
  // Tensors the objective carries from step to step (not parameters: the optimizer never sees
  // them): Stateful::state_dict() / load_state_dict(), saved in checkpoints under
  // "objective/<key>" and handed back on resume, so that a resumed run continues exactly.
  /// compute()'s part in a training step captured as a CUDA graph and replayed
  /// (refit/step_graph_support.h). The default, not replayable, keeps the loop eager.
  virtual StepGraphSupport step_graph_support() const { return {}; }
  /// Called by the loop before every training micro-step — eager or replayed from a CUDA graph —
  /// outside any capture. A replayable objective whose computation follows a schedule keeps the
  /// scheduled value in a device tensor and writes it here (a replay repeats the captured kernels
  /// with the arguments they were captured with; a host value read in compute() would be frozen).
  virtual void prepare_step(const ObjectiveContext& context) { (void)context; }
  /// An objective that needs the loop's events (DINO moves its centre at on_optimizer_step_end)
  /// also derives from Callback and returns itself here. It then receives every hook, before the
  /// run's callbacks; its Callback::step_graph_support() counts as a callback's; its state is
  /// saved once, as the objective's. (The loop asks rather than casting: a dynamic_cast across
  /// a plugin boundary is not reliable for classes a plugin hides.)
  virtual Callback* loop_hooks() { return nullptr; }
  /// Data-parallel runs refuse an objective with state (state_dict() not empty) unless it returns
  /// true here: it then sums what it derives from its batches over TrainState::collectives itself
  /// (DINO sums its window's teacher outputs before moving the centre), so that every rank holds
  /// the state one process reading the global batch would.
  virtual bool reduces_state_across_ranks() const { return false; }
};

using ObjectivePtr = std::shared_ptr<Objective>;

}  // namespace refit
