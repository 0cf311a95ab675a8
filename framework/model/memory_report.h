#pragma once
// Where a run's memory goes, by component (docs/performance.md, "Memory by component"):
// frozen weights, trainable weights, gradients, optimizer state, activations and the allocator's
// cache. `refit inspect` estimates them before training — weights, gradients and optimizer state
// from the registered parameters and the optimizer's rule, activations from one measured forward
// and backward on a training batch — and `refit train` measures them: the live tensors for
// weights, gradients and optimizer state, and for activations the peak the allocator saw inside
// the steps above what the step began with (refit's host allocator on the CPU, the caching
// allocator's statistics on CUDA).
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/recipe.h"
#include "model/model_registry.h"
#include "refit/state.h"

namespace refit {


struct MemoryBreakdown {
  std::int64_t frozen_weights = 0;     // parameters that do not train, and every buffer
  std::int64_t trainable_weights = 0;  // trained parameters and EMA copies
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::optional<std::int64_t> activations;      // saved for the backward and the step's temporaries, at their peak
  std::optional<std::int64_t> allocator_cache;  // freed blocks the allocator keeps for reuse
  std::string activations_note;                 // how the activations figure was obtained

  std::int64_t total() const;
  nlohmann::json to_json() const;
};

/// Weights from the registry; gradients and optimizer state predicted: a gradient per trainable
/// parameter in its dtype, and AdamW/Adam two moments per trainable parameter in its dtype (SGD
/// with momentum one, plain SGD none).
MemoryBreakdown estimate_memory(const ModelRegistry& models, const OptimizerSpec& optimizer);

/// Everything from the live tensors: weights from the storages the models' modules reach
/// (not the registry's list, which the estimate reads), gradients, the optimizer's state.
MemoryBreakdown measure_memory(const ModelRegistry& models, const Stateful& optimizer);

/// "frozen weights   12.3 MiB" lines, with a measured column beside the estimate when given.
std::string memory_table(const MemoryBreakdown& estimate, const MemoryBreakdown* measured = nullptr);

/// "1.5 MiB", "320 B".
std::string bytes_string(double bytes);

/// Optimizer state tensors per trainable parameter, each of the parameter's size and dtype
/// (zeros_like, as PyTorch's): AdamW/Adam 2 (the moments), SGD with momentum 1, plain SGD 0.
int optimizer_state_tensors(const OptimizerSpec& optimizer);

}  // namespace refit
