#pragma once
// Checkpoints: the trainable weights as safetensors (with a fingerprint of the frozen base so a
// checkpoint is never applied to another base), and the full training state for exact resume:
// every model's buffers, the counters, the gradients accumulated so far when the checkpoint
// falls inside an accumulation window, and the state_dict() of every Stateful component
// (refit/state.h: optimizer, scaler, RNG, objective, callbacks) under "<component>/<key>". A checkpoint is a directory written under a temporary
// name and renamed into place, then `latest` is rewritten atomically: a run killed at any
// moment leaves either the previous checkpoint or the new one, never a part.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/model_registry.h"
#include "precision/grad_scaler.h"
#include "refit/callback.h"
#include "refit/state.h"
#include "train/optimizer.h"
#include "train/resume_fingerprint.h"
#include "train/retention.h"

namespace refit {

/// What stands for a frozen tensor's values in the base fingerprint.
enum class BaseFingerprint {
  /// For a model read from weights files, their sampled digest (RegisteredModel::weights) stands
  /// for the parameters read from them: O(files) to compute, not O(bytes). Other frozen tensors
  /// (models built from the seed, adapters' frozen parameters) are hashed byte by byte.
  file_digests,
  /// Every frozen tensor's bytes (what checkpoints written before 0.6.0 hold).
  bytes,
};

/// A hash of every frozen parameter and packed weight (name, dtype, shape, and the values as
/// `how` says) of every registered model.
std::string base_fingerprint(const ModelRegistry& models, BaseFingerprint how = BaseFingerprint::file_digests);

struct CheckpointState {
  Counters counters;
  std::optional<double> metric;             // watched metric of the evaluation of these weights (for retention)
  std::optional<std::int64_t> metric_step;  // the step of that evaluation (= counters.step)
  bool in_window = true;                    // inside an accumulation window: the gradients so far are saved too
  ResumeFingerprint fingerprint;            // what a resume must keep (train/resume_fingerprint.h)
};

/// The run's Stateful components by name ("optimizer", "scaler", "rng", "objective",
/// "callback/3"); a name holds no "/"-separated key of another.
using StateComponents = std::vector<std::pair<std::string, Stateful*>>;

/// Writes <root>/step-<N> and updates <root>/latest. Returns the checkpoint's directory.
/// `fingerprint` is base_fingerprint(models), computed once per run (the base does not change).
std::filesystem::path save_checkpoint(const std::filesystem::path& root, const ModelRegistry& models,
                                      const std::string& fingerprint, const StateComponents& components,
                                      const CheckpointState& state);

/// Restores everything save_checkpoint wrote: trained weights, every model's buffers (BatchNorm
/// running statistics), in-window gradients, counters, and each component's state. Throws
/// refit::Error (nothing changed) when the checkpoint belongs to another base model or other
/// trainable parameters, lacks a buffer or a component's state, or was written by a run whose
/// fingerprint differs from `current` in a key not in `allowed`. Its counters must be integers a
/// run can reach (0 <= step <= max_steps when max_steps >= 0, iteration and epoch within [0, step],
/// skipped iterations within [0, iteration]) and its in-window gradients must have their
/// parameters' shapes: all of it is checked before anything is changed.
CheckpointState load_checkpoint(const std::filesystem::path& dir, ModelRegistry& models, const StateComponents& components,
                                const ResumeFingerprint& current = {}, const std::vector<std::string>& allowed = {},
                                std::int64_t max_steps = -1);

/// Restores the trained weights of a checkpoint (for export and evaluation), after checking the
/// frozen base's fingerprint and that the parameters match exactly, and the buffers it holds
/// (BatchNorm statistics).
void load_trainable_weights(const std::filesystem::path& dir, ModelRegistry& models);

/// <root>/latest resolved to a checkpoint directory, if any.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);

/// The directory name of the checkpoint of `step` ("step-00000040").
std::string checkpoint_dir_name(std::int64_t step);

/// Applies a retention policy to the checkpoints under root (deletes directories).
void apply_retention(const std::filesystem::path& root, const RetentionPolicy& policy);

}  // namespace refit
