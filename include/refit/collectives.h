// Collective operations over the ranks of a data-parallel run, for state a plugin computes from
// each rank's own batches (DINO's centre): summed over the ranks, it is the state of one process
// reading the global batch. The loop hands them out in TrainState::collectives (null in one
// process). Every rank must make the same calls in the same order, at the same hook.
#pragma once

#include <vector>

#include <torch/types.h>

namespace refit {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Sums each tensor over the ranks, in place (on the run's device). Throws refit::Error naming
  /// a lost rank.
  virtual void all_reduce_sum(const std::vector<torch::Tensor>& tensors) = 0;
};

}  // namespace refit
