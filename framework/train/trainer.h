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
#include "train/best_weights.h"
#include "train/checkpoint.h"
#include "train/early_stopping.h"
#include "train/evaluation.h"
#include "train/replicas.h"
#include "train/schedule.h"
#include "train/step_executor.h"

namespace refit {

struct TrainerParts {
  ModelRegistry* models = nullptr;
  std::shared_ptr<DataLoader> train;
  std::shared_ptr<DataLoader> val;  // optional
  ObjectivePtr objective;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<CallbackPtr> callbacks;
  std::vector<EvaluatorPtr> evaluators;                        // run at every validation, after the val loss
  std::map<std::string, std::shared_ptr<EvalData>> eval_sets;  // /data/sets, for the evaluators
  TrainingSpec training;
  SchedulerSpec scheduler;
  Precision precision = Precision::fp32;
  torch::Device device = torch::kCPU;
  // Checkpoints: written under checkpoint_root when /training/checkpoint_every is due, when a
  // callback requests one, and at the end; resume_from restores one before the first step.
  PrefetchOptions prefetch;  // worker threads computing batches ahead
  std::filesystem::path checkpoint_root;
  std::optional<std::filesystem::path> resume_from;
  RetentionPolicy retention;
  ResumeFingerprint fingerprint;  // recorded in checkpoints, checked on resume
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
  std::string stopped_early;                       // early stopping's reason, when it ended the run
  std::optional<std::int64_t> restored_best_step;  // restore_best: the step whose weights the run ends with
};

/// Whether training steps are captured as a CUDA graph and replayed (/training/cuda_graph).
enum class GraphMode {
  not_requested,  // /training/cuda_graph is off
  capture,        // the run qualifies: eager warm-up steps, then a capture and replays
  refused,        // asked for, but something in the run keeps it eager (the reason is stated)
};

/// Total micro-batch steps a duration means for a loader and an accumulation factor.
std::int64_t steps_for(const Duration& d, std::int64_t batches_per_epoch, std::int64_t accumulation);

class Trainer {
 public:
  explicit Trainer(TrainerParts parts);
  TrainSummary fit();
  /// Evaluates the objective on `loader` (train/evaluation.h), between the evaluation hooks.
  EvalResult evaluate(const DataLoader& loader, const std::string& split = "val");
  /// The validation: the objective on the val data (if any), then every evaluator.
  EvalResult validate();
  bool has_validation() const { return evaluation_->has_validation(); }
  GraphMode graph_mode() const { return graph_mode_; }
  /// What the CUDA-graph mode means for this run, for people: "" when not requested, "on", or
  /// "off: <why>" (docs/training-loop.md); after fit(), what happened ("on: step 3 captured; 12
  /// replays, 3 eager steps", "off: the capture at step 3 failed (...)").
  std::string cuda_graph_plan() const;

 private:
  // fit(), top to bottom: begin, one accumulation window at a time, end.
  void begin_run(TrainSummary& summary);
  void run_window(StepExecutor& executor, Prefetcher& batches_ahead, TrainSummary& summary);
  void end_run(StepExecutor& executor, TrainSummary& summary);
  // A window's batches, fetched whole: its normaliser (samples or tokens, over every rank) must
  // be known before the first backward.
  struct Window {
    std::vector<Batch> batches;
    std::vector<std::int64_t> counts;      // each micro-batch's Objective::count(), on the host
    std::int64_t count = 0;                // the objective's normaliser, over the world
    std::int64_t other_ranks_samples = 0;  // data-parallel: what the samples counter adds at its end
  };
  Window fetch_window(Prefetcher& batches_ahead, std::int64_t start, std::int64_t length);
  // The running micro-batch's count (Window::counts), which forward_backward() reports its loss
  // over: read on the host before the batch moved, never from the device.
  std::int64_t micro_batch_count_ = 0;
  // One micro-step and its hooks; the update when it ends the window.
  void micro_step(StepExecutor& executor, const Window& w, std::int64_t i, std::int64_t length);
  // Evaluations and checkpoints that fell due; true when a callback asked the run to stop.
  bool after_micro_step(bool window_end, bool epoch_end, TrainSummary& summary);

  // One micro-step's device work — forward and backward, then at a window's end the update —
  // writing the StepResult's tensors; `hooks` emits the callbacks inside the step. On the
  // graph-safe path it reads nothing on the host, so it can be captured (train/step_graph.h).
  void forward_backward(const ModelMap& models, const Batch& batch, std::int64_t window_count, bool hooks,
                        StepResult& result);
  void update_on_device(StepResult& result, bool hooks);
  // The host side of an update: counters, the schedule, on_optimizer_step_end.
  void finish_update(StepResult& result);
  std::pair<GraphMode, std::string> plan_cuda_graph() const;
  // Eager, or graph capture and replay when the mode is capture (train/step_executor.h).
  std::unique_ptr<StepExecutor> make_executor(const ModelMap& models);
  void save_checkpoint_now();
  // Early stopping's verdict on a validation: keeps the best weights, asks the run to stop.
  void judge(const EvalResult& r);
  // restore_best at the end: the best weights back in the models, evaluated and checkpointed.
  void restore_best(TrainSummary& summary);
  // Everything Stateful a checkpoint saves, by name (train/checkpoint.h).
  StateComponents state_components();
  void sync_skip_count();
  std::vector<torch::Tensor> trainable_grads() const;
  template <class F>
  void emit(F&& f) {
    if (objective_hooks_) f(*objective_hooks_);
    for (auto& c : parts_.callbacks) f(*c);
  }

  TrainerParts parts_;
  // The objective's own hooks (Objective::loop_hooks): it gets every hook, before the run's
  // callbacks (DINO moves its centre at on_optimizer_step_end). Its state is saved as the objective's.
  Callback* objective_hooks_ = nullptr;
  TrainState state_;
  std::unique_ptr<Replicas> replicas_;  // data-parallel synchronisation (no-ops in one process)
  std::unique_ptr<Evaluation> evaluation_;
  TrainerControl control_;
  GradScaler scaler_;
  RngState rng_;
  std::unique_ptr<LrSchedule> schedule_;
  std::vector<torch::Tensor> trainable_;
  std::string base_fingerprint_;
  std::optional<EvalResult> last_eval_;
  std::int64_t last_checkpoint_step_ = -1;
  // Fell due since the last evaluation / checkpoint (data-parallel: held to the window's end).
  bool evaluation_due_ = false, checkpoint_due_ = false;
  torch::Tensor pending_skips_;  // device int64: skipped updates not yet added to the counters
  GraphMode graph_mode_ = GraphMode::not_requested;
  std::string graph_note_;                         // refused: why; after fit: what the executor reports
  bool persistent_grads_ = false;                  // graph mode: gradients zeroed in place, never set to none
  std::unique_ptr<EarlyStopping> early_stopping_;  // /training/early_stopping
  std::unique_ptr<BestWeights> best_weights_;      // its restore_best
  std::string stopped_early_;
};

}  // namespace refit
