#pragma once
// An evaluator measures the models on whole labelled data sets, where a per-batch loss cannot
// (k-NN accuracy needs every feature of a bank before the first query). It runs at every
// evaluation of the loop, after the objective's validation loss, and its metrics join the
// evaluation's ("knn_accuracy").
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/callback.h"
#include "refit/dataset.h"
#include "refit/objective.h"

namespace refit {

/// A labelled data set from the recipe's /data/sets, batched by the framework in a fixed order
/// (no shuffling, no sample dropped); every batch arrives on the run's device.
class EvalData {
 public:
  virtual ~EvalData() = default;
  virtual std::int64_t batches() const = 0;
  virtual Batch batch(std::int64_t index) const = 0;
  virtual std::int64_t size() const = 0;
  virtual std::int64_t num_classes() const = 0;       // -1 when the dataset does not say
  virtual std::vector<FieldInfo> fields() const = 0;  // what every batch carries
};

struct EvaluatorContext {
  const TrainState& state;
  torch::Device device = torch::kCPU;
  std::uint64_t seed = 0;                       // for evaluators that draw random numbers
  std::map<std::string, const EvalData*> data;  // /data/sets/<name>, those required_data() names
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  /// Names of the registered models it reads (checked by `refit validate`).
  virtual std::vector<std::string> required_models() const = 0;
  /// Names of the data sets under /data/sets it reads (checked by `refit validate`).
  virtual std::vector<std::string> required_data() const = 0;
  /// The metric names evaluate() returns (known from the config), so that `refit validate`
  /// refuses two evaluators reporting the same name before any training.
  virtual std::vector<std::string> metric_names() const = 0;
  /// The fields read from each data set of required_data(), given the built models (`refit
  /// validate` checks them against what the set produces). The default: nothing is checked.
  virtual std::map<std::string, std::vector<std::string>> required_fields(const ModelMap& models) const {
    (void)models;
    return {};
  }
  /// Called with every model in eval mode, gradients off and the run's autocast active; the
  /// training RNG stream is saved before and restored after. Returns metric name -> value.
  virtual std::map<std::string, double> evaluate(const ModelMap& models, const EvaluatorContext& context) = 0;
};

using EvaluatorPtr = std::shared_ptr<Evaluator>;

}  // namespace refit
