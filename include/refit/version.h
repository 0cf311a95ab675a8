#pragma once
// Versions that the host and every plugin must agree on.

namespace refit {

/// refit's own release.
inline constexpr const char* kVersion = "0.6.0";

/// Bumped whenever anything in include/refit/ changes layout or meaning in a way a compiled
/// plugin would notice (a struct field, a virtual function, a factory signature). The host
/// refuses a plugin built against another API version before calling any of its code.
inline constexpr unsigned kPluginApiVersion = 6;
// API 2 (refit 0.2.0): Example/Batch views and global_views (multi-crop), Dataset::sample(index,
// epoch), Objective receives an ObjectiveContext, may carry checkpointed state and names its
// metrics, TrainState::max_iterations, Evaluator (with metric_names) and its factory table.
// API 3 (refit 0.3.0): Objective::graph_safe(), Objective::prepare_step() and
// Callback::needs_inner_step_hooks() (CUDA-graph capture of the training step),
// Dataset::sample_batch (whole-batch gathering).
// API 4 (refit 0.4.0): named fields end to end (refit/fields.h): Example and Batch are sets of
// named tensors, Dataset::fields() declares them (with padding), Model reads input_fields() and
// returns named outputs (forward_fields; TensorModel for one tensor in, one out), objectives and
// evaluators declare required_fields(); see docs/plugins.md "Migrating from API 3".
// API 5 (refit 0.5.0): the CUDA-graph flags are one declared StepGraphSupport
// (Objective/Callback::step_graph_support() replace graph_safe() and needs_inner_step_hooks()),
// Objective::loop_hooks() replaces the framework's dynamic_cast to Callback, Model::module_renames()
// replaces the ReferenceModuleNames base, Adapter::name(), Model::non_persistent_buffers(); see
// docs/plugins.md "Migrating from API 4".
// API 6 (refit 0.6.0): decoder language models: Model::decoder() (refit/generation.h, token-by-token
// decoding for refit generate), Objective::add_derived_metrics() (perplexity), the Tokenizer
// interface (refit/tokenizer.h); Model::dense_layers(), Model::describe() (the run header's line
// about a model); see docs/plugins.md "Migrating from API 5".

/// What changed in each API version, for the message that refuses a plugin built for another.
inline const char* plugin_api_changes(unsigned from) {
  if (from == 5)
    return "API 6 added Model::decoder() (refit/generation.h) and Objective::add_derived_metrics(), which change "
           "the classes' layout, and the Tokenizer interface (refit/tokenizer.h); see docs/plugins.md, \"Migrating "
           "from API 5\"";
  if (from == 4)
    return "API 5 replaced Objective::graph_safe() and Callback::needs_inner_step_hooks() by step_graph_support() "
           "(refit/step_graph_support.h), an objective that is also a Callback returns itself from loop_hooks(), "
           "ReferenceModuleNames became Model::module_renames(), and Adapter::name() names an adapter; see "
           "docs/plugins.md, \"Migrating from API 4\"";
  if (from < 4)
    return "API 4 replaced Example/Batch {input, target, views} by named fields (refit/fields.h), "
           "Model::forward(tensor) by input_fields()/output_fields()/forward_fields() (TensorModel keeps "
           "forward(tensor)), and added Dataset::fields() and required_fields(); see docs/plugins.md, "
           "\"Migrating from API 3\"";
  return "";
}

}  // namespace refit
