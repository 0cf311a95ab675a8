#pragma once
// How the loop's micro-steps run on the device: eagerly, or captured once as a CUDA graph and
// replayed (/training/cuda_graph). The trainer owns what a step computes (StepWork: forward and
// backward, the update on the device) and the host bookkeeping around it (counters, schedule,
// callbacks, evaluation, checkpoints); an executor only decides how that device work is launched.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/callback.h"
#include "refit/dataset.h"
#include "train/step_graph.h"

namespace refit {

/// The device work of a micro-step, provided by the trainer.
struct StepWork {
  /// Forward and backward of one micro-batch; `hooks`: emit the callbacks inside the step.
  std::function<void(const Batch& batch, std::int64_t window_count, bool hooks, StepResult& result)> forward_backward;
  /// The window's update on the device (unscale, clip, step or skip, scaler update, zero grads).
  std::function<void(StepResult& result, bool hooks)> update;
  /// Creates the optimizer state a captured update must find in place (not create).
  std::function<void()> materialize_state;
  /// The parameters whose gradients a failed capture restores.
  std::vector<torch::Tensor> trainable;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  /// The window's batches, on the device, before its micro-steps run.
  virtual void begin_window(const std::vector<Batch>& batches) { (void)batches; }
  /// Forward and backward of one micro-batch — and, when the step is replayed from a graph, at a
  /// window's end the update too. `window`: the window's micro-batch count; `k`: the recipe's;
  /// `step`: the run's step counter (for reports).
  virtual StepResult forward_backward(const Batch& batch, std::int64_t window_count, bool window_end, std::int64_t window,
                                      std::int64_t k, std::int64_t step) = 0;
  /// At a window's end, after the micro-batch has been counted: the update on the device, unless
  /// forward_backward() already did it.
  virtual void update(StepResult& result) = 0;
  /// What happened, for logs and summary.json: "" when eager by design.
  virtual std::string report() const { return ""; }
};

/// Every micro-step eager, with every hook.
std::unique_ptr<StepExecutor> make_eager_executor(StepWork work);

/// Makes a StepGraph (a CUDA graph; tests substitute a stand-in).
using StepGraphFactory = std::function<std::unique_ptr<StepGraph>()>;

/// After `warmup` eager steps, the window's last micro-step (with the update) is captured as one
/// graph and, when k > 1, the others as a second; both are replayed for every later full window
/// whose batches fit the captured shapes, and everything else runs eagerly. The steps run on a
/// side stream of `device`. A failed capture is reported and the run goes on eagerly.
std::unique_ptr<StepExecutor> make_graph_executor(StepWork work, torch::Device device, std::int64_t warmup,
                                                  StepGraphFactory make_graph);

}  // namespace refit
