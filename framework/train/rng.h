#pragma once
// The state of every default random generator (CPU and each CUDA device), captured and restored
// as a unit: evaluation runs under its own seed and restores the training stream afterwards,
// and checkpoints store it for exact resume.
#include <map>
#include <string>

#include <torch/types.h>

#include "refit/state.h"

namespace refit {

/// device string ("cpu", "cuda:0") -> generator state (uint8 CPU tensor).
std::map<std::string, torch::Tensor> capture_rng();
/// Restores the generators named in `states` (others are left alone).
void restore_rng(const std::map<std::string, torch::Tensor>& states);
/// The default generators as a Stateful component of checkpoints ("cpu", "cuda:0", ...).
class RngState : public Stateful {
 public:
  StateDict state_dict() const override { return capture_rng(); }
  void load_state_dict(const StateDict& state) override { restore_rng(state); }
};

/// Seeds every default generator.
void seed_all(std::uint64_t seed);

}  // namespace refit
