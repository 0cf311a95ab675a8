#pragma once
// The trainable weights of the best evaluation so far, for early stopping's restore_best: a copy
// taken when the metric improves (trainable weights are the small part of a fine-tune: adapters,
// heads), copied back into the models when the run ends. Part of every checkpoint, so that a
// resumed run restores the best weights of the whole run, not of its own part.
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_registry.h"
#include "refit/state.h"

namespace refit {

class BestWeights : public Stateful {
 public:
  explicit BestWeights(ModelRegistry& models) : models_(models) {}

  /// Copies the current trainable weights (and EMA copies) of every model.
  void keep(std::int64_t step);
  /// Copies the kept weights back into the models; false when none were kept.
  bool restore();
  bool empty() const { return copies_.empty(); }
  std::int64_t step() const { return step_; }

  /// "<model>/<parameter>" -> the kept copy, and "step".
  StateDict state_dict() const override;
  /// Throws refit::Error (nothing changed) when a weight is missing or has another shape.
  void load_state_dict(const StateDict& state) override;

 private:
  std::vector<std::pair<std::string, torch::Tensor>> targets() const;

  ModelRegistry& models_;
  StateDict copies_;
  std::int64_t step_ = -1;
};

}  // namespace refit
