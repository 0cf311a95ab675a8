#pragma once
// How a component takes part in a training step that the loop captures once as a CUDA graph
// and replays (/training/cuda_graph; docs/training-loop.md). Objectives and callbacks each
// declare it; the loop captures only when every one of them allows it, and otherwise runs every
// step eagerly with every hook. Unsure: keep the defaults, which are always correct.

namespace refit {

struct StepGraphSupport {
  /// The component's device work inside the step may be recorded once and replayed on later
  /// batches of the same shapes: the same kernels every training step, no host reads (.item(),
  /// data-dependent shapes) and no host value that changes from step to step (a schedule read
  /// from the TrainState). An objective with a schedule keeps the value in a device tensor and
  /// writes it in Objective::prepare_step, which the loop calls before every step, outside any
  /// capture. Objectives: false unless declared; callbacks, whose hooks run outside the step: true.
  bool replayable = false;
  /// The component needs the hooks inside the step (on_compute_loss_*, on_backward_*,
  /// on_before_optimizer_step). A replayed step has no inside: in graph mode the loop calls
  /// on_step_begin before a step and on_optimizer_step_end / on_step_end after it, and the inner
  /// hooks for no step (eager ones included). True keeps the run eager.
  bool inner_step_hooks = false;
};

}  // namespace refit
