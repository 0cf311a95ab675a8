#pragma once
// Evaluation, as the training loop and `refit evaluate` run it: the objective's loss and metrics
// over a data set, then (a validation) every evaluator — no grad, every model in eval mode
// (restored after), the training autocast, a scoped seed. In a data-parallel run each rank
// scores its own block of the data and the sums are reduced over the ranks.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/loader.h"
#include "distributed/process_group.h"
#include "model/model_registry.h"
#include "precision/mode.h"
#include "refit/callback.h"
#include "refit/evaluator.h"
#include "refit/objective.h"

namespace refit {

struct EvaluationParts {
  ModelRegistry* models = nullptr;
  ObjectivePtr objective;
  std::shared_ptr<DataLoader> val;                             // optional: the objective's validation data
  std::vector<EvaluatorPtr> evaluators;                        // run at every validation, after the val loss
  std::map<std::string, std::shared_ptr<EvalData>> eval_sets;  // /data/sets, for the evaluators
  Precision precision = Precision::fp32;
  torch::Device device = torch::kCPU;
  std::uint64_t seed = 0;               // the run's; evaluation seeds from it
  std::shared_ptr<ProcessGroup> group;  // data-parallel: the sums are the world's
};

class Evaluation {
 public:
  explicit Evaluation(EvaluationParts parts);
  /// Whether a validation has anything to do (val data or evaluators).
  bool has_validation() const { return parts_.val || !parts_.evaluators.empty(); }
  /// The objective on `loader` (no evaluators), as split `split`.
  EvalResult evaluate(const DataLoader& loader, const std::string& split, const TrainState& state);
  /// The objective on the val data (if any), then every evaluator.
  EvalResult validate(const TrainState& state);

 private:
  EvalResult run(const DataLoader* loader, const std::string& split, bool run_evaluators, const TrainState& state);
  struct Sums {
    torch::Tensor loss;
    std::map<std::string, torch::Tensor> metrics;
    std::int64_t count = 0;
  };
  Sums objective_sums(const DataLoader& loader, const ModelMap& models, const TrainState& state);
  // Data-parallel: every rank's sums to every rank (the same metric names required everywhere).
  void reduce_over_ranks(Sums& sums, const std::string& split);
  void add_evaluator_metrics(EvalResult& r, const ModelMap& models, const TrainState& state);

  EvaluationParts parts_;
};

}  // namespace refit
