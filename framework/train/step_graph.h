#pragma once
// The training step captured as one CUDA graph (/training/cuda_graph).
//
// An eager step launches a few hundred kernels, each costing host time in the dispatcher,
// autograd and the CUDA driver; for small models that host time is the step time. Captured once
// and replayed, the same kernels are launched by the driver in one call. What a replay needs:
// inputs at fixed addresses (the batch is copied into buffers the graph reads), every tensor
// the step writes either persistent (parameters, optimizer and scaler state, the skip counter)
// or allocated inside the graph's private pool (activations, gradients, the step's outputs),
// no host reads inside the step, and no value baked into a kernel launch that changes between
// steps (the learning rate is a device tensor: Optimizer::use_device_lr). The trainer decides
// whether a run qualifies (docs/training-loop.md); the graph step executor
// (train/step_executor.h) decides when to capture and replay; this class keeps the static batch
// and the step's outputs, and a backend records and launches: a CUDA graph
// (make_cuda_step_graph), or in tests a stand-in that re-runs the step on the static batch.
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include <torch/types.h>

#include "refit/callback.h"
#include "refit/dataset.h"

namespace refit {

class StepGraph {
 public:
  virtual ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  /// The step's device work, writing its outputs into the StepResult's tensor fields.
  using Step = std::function<void(const Batch&, StepResult&)>;

  bool captured() const;
  /// True when `batch` fits the captured buffers: same shapes and dtypes of input, target and
  /// views, and the same normaliser (the sample/token count baked into the loss scaling).
  bool fits(const Batch& batch, std::int64_t count) const;
  /// A capture that failed and was closed cleanly: nothing ran, the step graph is unusable, and
  /// the caller can go on eagerly. (A capture that cannot be closed cleanly throws refit::Error:
  /// CUDA's capture state would be unsafe to continue with.)
  struct CaptureFailed : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  /// Copies `batch` into new static buffers, records `step` on them and replays it once
  /// (recording runs nothing). Throws CaptureFailed if the capture fails; the step has then not run.
  /// `share_pool_with`: a captured graph whose memory pool this one shares (their temporaries
  /// never live at the same time: one finishes before the other starts, and what one hands out
  /// is copied before the other runs).
  StepResult capture(const Batch& batch, std::int64_t count, const Step& step, const StepGraph* share_pool_with = nullptr);
  /// Copies `batch` into the static buffers and replays the graph. The returned tensors are
  /// this step's values (copied out of the graph's buffers, which the next replay overwrites).
  StepResult replay(const Batch& batch);

 protected:
  StepGraph();
  /// Records `run` (the step on the static batch, writing the outputs) so that launch() repeats
  /// it; `share_pool_with` as in capture(). Returns true when recording ran it once already (a
  /// stand-in that executes while it records), false when it only recorded (a CUDA graph).
  /// Throws CaptureFailed when the step failed and nothing of it ran.
  virtual bool record(const std::function<void()>& run, const StepGraph* share_pool_with) = 0;
  /// Runs what record() recorded.
  virtual void launch() = 0;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// A StepGraph backed by a CUDA graph on `device` (a CUDA device; throws refit::Error otherwise).
std::unique_ptr<StepGraph> make_cuda_step_graph(torch::Device device);

/// Runs the CUDA work of its scope on a stream of its own instead of the default stream:
/// graphs cannot be captured on the default stream, and the eager steps that warm a capture up
/// (cuBLAS workspaces, allocator blocks) should run on the stream the capture uses.
class SideStream {
 public:
  explicit SideStream(torch::Device device);
  ~SideStream();
  /// Takes an accumulation window's batches for use on this stream: work queued on the outer
  /// stream so far (a dataset producing device tensors on a loader thread) comes first (one
  /// event for the window, no host wait), and the batches' device memory is marked as used by
  /// this stream.
  void adopt(const std::vector<Batch>& window);
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit
