#pragma once
// The training loop. It owns autocast, the gradient scaler, unscale-then-clip, accumulation,
// the learning-rate schedule and evaluation; callbacks observe it (see docs/training-loop.md
// for the hook order) and steer it only through TrainerControl.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/recipe.h"
#include "data/loader.h"
#include "data/prefetcher.h"
#include "distributed/process_group.h"
#include "model/model_registry.h"
#include "precision/grad_scaler.h"
#include "refit/callback.h"
#include "refit/evaluator.h"
#include "refit/objective.h"
#include "train/optimizer.h"
#include "train/resume_fingerprint.h"
#include "train/retention.h"
#include "train/rng.h"
#include "train/checkpoint.h"
#include "train/schedule.h"
#include "train/step_executor.h"

namespace refit {

struct TrainerParts {
  ModelRegistry* models = nullptr;
  std::shared_ptr<DataLoader> train;
  std::shared_ptr<DataLoader> val;             // optional
  ObjectivePtr objective;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<CallbackPtr> callbacks;
  std::vector<EvaluatorPtr> evaluators;        // run at every validation, after the val loss
  std::map<std::string, std::shared_ptr<EvalData>> eval_sets;  // /data/sets, for the evaluators
  TrainingSpec training;
  SchedulerSpec scheduler;
  Precision precision = Precision::fp32;
  torch::Device device = torch::kCPU;
  // Checkpoints: written under checkpoint_root when /training/checkpoint_every is due, when a
  // callback requests one, and at the end; resume_from restores one before the first step.
  PrefetchOptions prefetch;                    // worker threads computing batches ahead
  std::filesystem::path checkpoint_root;
  std::optional<std::filesystem::path> resume_from;
  RetentionPolicy retention;
  ResumeFingerprint fingerprint;               // recorded in checkpoints, checked on resume
  // With /training/cuda_graph: what makes the step graphs; unset: CUDA graphs on the run's
  // device. (Tests substitute a stand-in that re-runs the recorded step, to test the loop's
  // graph logic on a CPU.)
  StepGraphFactory make_step_graph;
  // Data-parallel: the process group of a run launched by torchrun (docs/distributed.md); unset
  // in a one-process run. The loaders must be sharded for it (LoaderOptions::rank).
  std::shared_ptr<ProcessGroup> group;
};

struct TrainSummary {
  Counters counters;
  std::optional<EvalResult> last_eval;
  double seconds = 0;
};

/// Total micro-batch steps a duration means for a loader and an accumulation factor.
std::int64_t steps_for(const Duration& d, std::int64_t batches_per_epoch, std::int64_t accumulation);

class Trainer {
 public:
  explicit Trainer(TrainerParts parts);
  TrainSummary fit();
  /// Evaluates the objective on `loader`: no grad, every model in eval mode (restored after), the
  /// training autocast, a scoped seed (the training RNG state is restored after).
  EvalResult evaluate(const DataLoader& loader, const std::string& split = "val");
  /// The validation: the objective on the val data (if any), then every evaluator.
  EvalResult validate();
  bool has_validation() const { return parts_.val || !parts_.evaluators.empty(); }
  /// Whether steps are replayed from a CUDA graph: "" when /training/cuda_graph is off, else
  /// "on" or "off: <why>" (the run qualifies or not: docs/training-loop.md); after fit(), what
  /// happened ("on: step 3 captured; 12 replays, 3 eager steps", "off: the capture at step 3
  /// failed (...)"), or still "on" when nothing was captured.
  const std::string& cuda_graph_plan() const { return graph_plan_; }

 private:
  EvalResult evaluate_impl(const DataLoader* loader, const std::string& split, bool evaluators);
  // One micro-step's device work — forward and backward, then at a window's end the update —
  // writing the StepResult's tensors; `hooks` emits the callbacks inside the step. On the
  // graph-safe path it reads nothing on the host, so it can be captured (train/step_graph.h).
  void forward_backward(const ModelMap& models, const Batch& batch, std::int64_t window_count, bool hooks,
                        StepResult& result);
  void update_on_device(StepResult& result, bool hooks);
  // The host side of an update: counters, the schedule, on_optimizer_step_end.
  void finish_update(StepResult& result);
  std::string plan_cuda_graph() const;
  // Eager, or graph capture and replay when the plan is "on" (train/step_executor.h).
  std::unique_ptr<StepExecutor> make_executor(const ModelMap& models);
  void save_checkpoint_now();
  // Everything Stateful a checkpoint saves, by name (train/checkpoint.h).
  StateComponents state_components();
  void sync_skip_count();
  // Rank 0 alone writes checkpoints; every rank runs the rest of the loop.
  bool leader() const { return !parts_.group || parts_.group->rank() == 0; }
  // Data-parallel: rank 0's trainable weights and buffers to every rank (before the first step).
  void broadcast_from_leader();
  // Data-parallel: checks that every rank holds the same weights (with `frozen_too` every
  // parameter and buffer, else the trainable parameters); throws naming the ranks that differ.
  void verify_replicas(bool frozen_too, const std::string& when);
  // Data-parallel: throws when the objective keeps state computed from its batches.
  void refuse_unreduced_objective_state();
  // Data-parallel: sums the window's local (count, samples) over the ranks.
  std::pair<std::int64_t, std::int64_t> global_window(std::int64_t count, std::int64_t samples);
  std::vector<torch::Tensor> trainable_grads() const;
  template <class F> void emit(F&& f) {
    if (objective_hooks_) f(*objective_hooks_);
    for (auto& c : parts_.callbacks) f(*c);
  }

  TrainerParts parts_;
  // The objective, when it is also a Callback: it gets every hook, before the run's callbacks
  // (DINO moves its centre at on_optimizer_step_end). Its state is saved as the objective's.
  CallbackPtr objective_hooks_;
  TrainState state_;
  // Data-parallel: what state_.collectives points to.
  std::unique_ptr<GroupCollectives> collectives_;
  TrainerControl control_;
  GradScaler scaler_;
  RngState rng_;
  std::unique_ptr<LrSchedule> schedule_;
  std::vector<torch::Tensor> trainable_;
  std::string base_fingerprint_;
  std::optional<EvalResult> last_eval_;
  std::int64_t last_checkpoint_step_ = -1;
  torch::Tensor pending_skips_;  // device int64: skipped updates not yet added to the counters
  std::string graph_plan_;
  bool persistent_grads_ = false;  // graph mode: gradients zeroed in place, never set to none
};

}  // namespace refit
