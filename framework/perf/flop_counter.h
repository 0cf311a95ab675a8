#pragma once
// Counts the floating-point operations a training step runs, by watching the products LibTorch
// dispatches (ATen's RecordFunction observers, the mechanism torch.profiler uses).
//
// Counting what runs, rather than a formula per model, makes the frozen-layer rule fall out of
// autograd: a frozen Linear runs its forward product (F) and, when something before it needs a
// gradient, the input-gradient product (F) — never the weight-gradient one; a trainable layer
// runs all three (3F); a block recomputed by gradient checkpointing runs its forward once more
// inside the backward. Every plugin's products are counted, with no help from its author.
//
// The formulas are those of torch.utils.flop_counter (FlopCounterMode), so a count can be checked
// against PyTorch's on the Python peer of a step: 2mnk per product (mm, addmm, bmm, baddbmm),
// PyTorch's convolution and convolution-backward counts, and scaled-dot-product attention as its
// two products forward and five backward (the scores recomputed). Element-wise work (norms,
// softmax, activations, the optimizer) is not counted, as in FlopCounterMode: on the models refit
// trains it is a few percent of the products.
//
// The observer sees every thread's ops (the autograd engine's device threads included) while a
// counter lives, and costs a callback per op then: the loop counts one window, not every step.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

namespace refit::perf {

/// Which part of a step the ops belong to (the loop says; the counter keeps a total per part).
enum class StepPhase { forward, backward, update };

/// FLOPs of one op from its name and its inputs and outputs as the dispatcher saw them; 0 for an
/// op without a formula (or whose arguments do not have the expected shapes).
std::int64_t op_flops(const std::string& name, c10::ArrayRef<const c10::IValue> inputs,
                      c10::ArrayRef<const c10::IValue> outputs);

/// The operators op_flops() has a formula for ("aten::mm", ...).
const std::vector<std::string>& counted_operators();

struct FlopCount {
  std::int64_t forward = 0, backward = 0, update = 0;
  std::map<std::string, std::int64_t> by_operator;  // "aten::mm" -> FLOPs
  std::int64_t total() const { return forward + backward + update; }
};

/// Counts while it lives: the products every thread dispatches, each outermost one once (an op a
/// counted op dispatches inside itself is part of it). One counter at a time; a second throws.
class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  void set_phase(StepPhase phase);
  FlopCount count() const;

 private:
  std::uint64_t handle_ = 0;
};

}  // namespace refit::perf
