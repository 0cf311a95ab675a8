#pragma once
// Versions that the host and every plugin must agree on.

namespace refit {

/// refit's own release.
inline constexpr const char* kVersion = "0.3.1";

/// Bumped whenever anything in include/refit/ changes layout or meaning in a way a compiled
/// plugin would notice (a struct field, a virtual function, a factory signature). The host
/// refuses a plugin built against another API version before calling any of its code.
inline constexpr unsigned kPluginApiVersion = 3;
// API 2 (refit 0.2.0): Example/Batch views and global_views (multi-crop), Dataset::sample(index,
// epoch), Objective receives an ObjectiveContext, may carry checkpointed state and names its
// metrics, TrainState::max_iterations, Evaluator (with metric_names) and its factory table.
// API 3 (refit 0.3.0): Objective::graph_safe(), Objective::prepare_step() and
// Callback::needs_inner_step_hooks() (CUDA-graph capture of the training step),
// Dataset::sample_batch (whole-batch gathering).

}  // namespace refit
