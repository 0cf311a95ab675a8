#pragma once
// Data-parallel synchronisation, in one place: what the ranks of a run launched by torchrun
// exchange so that they stay replicas of one model (docs/distributed.md). The Trainer calls it
// at named moments; in a one-process run every call does nothing, so the loop reads the same
// either way.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/process_group.h"
#include "model/model_registry.h"
#include "refit/objective.h"

namespace refit {

class Replicas {
 public:
  /// `group` unset: a one-process run.
  Replicas(std::shared_ptr<ProcessGroup> group, ModelRegistry& models, torch::Device device);

  bool data_parallel() const { return group_ != nullptr; }
  /// Rank 0 alone writes (checkpoints, the run folder); every rank runs the loop.
  bool leader() const { return !group_ || group_->rank() == 0; }
  int rank() const { return group_ ? group_->rank() : 0; }
  int size() const { return group_ ? group_->size() : 1; }
  /// What TrainState::collectives points to: nullptr unless there are several ranks.
  Collectives* collectives() { return collectives_.get(); }
  ProcessGroup* group() const { return group_.get(); }

  /// Before the first step: rank 0's trainable weights and buffers to every rank, then a check
  /// that every parameter and buffer agrees (a rank that loaded other weights fails here).
  void start();
  /// Throws when the objective keeps state computed from its own batches and does not sum it
  /// over the ranks (the ranks would drift apart without a sign).
  void refuse_unreduced_state(const Objective& objective) const;
  /// The window's (count, samples), summed over the ranks: the normaliser of the global batch.
  std::pair<std::int64_t, std::int64_t> global_window(std::int64_t count, std::int64_t samples,
                                                      std::int64_t iteration) const;
  /// At a window's start: rank 0's buffers (BatchNorm statistics) to every rank, as PyTorch's DDP
  /// does before each forward.
  void broadcast_buffers(std::int64_t iteration);
  /// At a window's end, before unscaling: one sum of the (still scaled) gradients, so that every
  /// rank holds the global batch's and the non-finite check, clipping, the skip decision and the
  /// step agree everywhere. A gradient a rank did not produce is zeros.
  void reduce_gradients(std::vector<torch::Tensor>& trainable, std::int64_t iteration);
  /// Whether what fell due (an evaluation, a checkpoint) waits for the window's end: inside a
  /// window each rank's gradients and window sums are still its own.
  bool defer_to_window_end(bool window_end) const { return group_ && !window_end; }
  /// Throws naming the ranks whose weights differ from rank 0's (trainable parameters; with
  /// `frozen_too` every parameter and buffer).
  void verify(bool frozen_too, const std::string& when);

 private:
  std::shared_ptr<ProcessGroup> group_;
  ModelRegistry& models_;
  torch::Device device_;
  std::unique_ptr<GroupCollectives> collectives_;
  std::vector<torch::Tensor> buffers_;  // of the trained models (not EMA copies), broadcast per window
};

}  // namespace refit
