#pragma once
// One state interface for everything that changes while training and that an exact resume
// needs: the optimizer, the gradient scaler, the RNG streams, the objective (DINO's centre),
// each callback. Checkpoints save every component's state_dict() under "<component>/<key>" and
// hand it back through load_state_dict(); nothing is special-cased. (Model parameters and
// buffers are saved by the checkpoint itself, with the frozen base's fingerprint; the data
// position is the step counter: batches are a function of it.)
#include <map>
#include <string>

#include <torch/types.h>

namespace refit {

using StateDict = std::map<std::string, torch::Tensor>;

class Stateful {
 public:
  virtual ~Stateful() = default;
  /// The tensors to save (device tensors are fine: the checkpoint copies them). Empty: nothing.
  virtual StateDict state_dict() const { return {}; }
  /// Restores what state_dict() returned, as CPU tensors read from a checkpoint, before the
  /// first step of a resumed run (move them where they are used). Throws refit::Error when the
  /// state does not fit (a key missing, another shape) — before changing anything.
  virtual void load_state_dict(const StateDict& state) { (void)state; }
};

}  // namespace refit
