#pragma once
// Features for the evaluators: a labelled set's every sample run through a chain of models.
#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/config.h"
#include "refit/evaluator.h"

namespace refit {

struct Features {
  torch::Tensor x;       // [N, D] float32, on the device
  torch::Tensor labels;  // [N] int64, on the device
};

/// Runs every batch through `chain` in order (["backbone"], or ["backbone", "neck"]), without
/// gradients, and concatenates the last model's main outputs: trailing dimensions are flattened into D and
/// the features converted to float32 (they may come out of autocast in bf16). Throws
/// refit::Error when a model is missing, the set is empty, or a batch's targets are not one
/// class index per sample (the field `labels`).
Features extract_features(const ModelMap& models, const std::vector<std::string>& chain, const EvalData& data,
                          torch::Device device, const std::string& set_name, const std::string& labels = "labels");

/// The set named `name` in the context's data; a clear refit::Error when it is absent.
const EvalData& eval_data(const EvaluatorContext& context, const std::string& name);

/// Classes of a labelled set: data.num_classes() when it says (checked against the labels),
/// else max(label) + 1. Labels must be non-negative.
std::int64_t class_count(const EvalData& data, const torch::Tensor& labels, const std::string& set_name);

/// Reads the keys every built-in evaluator shares: "models" (a non-empty array of model names,
/// the chain), "bank" and "queries" (names under /data/sets), "labels" (the field of class
/// indices, "labels") and "metric" (the metric's name).
struct FeatureSetsConfig {
  std::vector<std::string> chain;
  std::string bank, queries, labels = "labels", metric;
};
FeatureSetsConfig read_feature_sets_config(const ConfigReader& c, const std::string& default_metric);

/// torch.nn.functional.normalize(x, p=2, dim=1) (eps 1e-12), as DINO applies to features.
torch::Tensor l2_normalize(const torch::Tensor& x);

/// What both built-in evaluators share: the models, data sets and metric of a FeatureSetsConfig,
/// and the features of the bank and the queries (computed once when they are the same set).
class FeatureSetsEvaluator : public Evaluator {
 public:
  explicit FeatureSetsEvaluator(FeatureSetsConfig sets) : sets_(std::move(sets)) {}
  std::vector<std::string> required_models() const override { return sets_.chain; }
  std::vector<std::string> metric_names() const override { return {sets_.metric}; }
  std::vector<std::string> required_data() const override {
    if (sets_.bank == sets_.queries) return {sets_.bank};
    return {sets_.bank, sets_.queries};
  }
  std::map<std::string, std::vector<std::string>> required_fields(const ModelMap& models) const override {
    auto fields = chain_fields(models, sets_.chain);
    fields.push_back(sets_.labels);
    std::map<std::string, std::vector<std::string>> out;
    for (const auto& set : required_data()) out[set] = fields;
    return out;
  }

 protected:
  struct BankAndQueries {
    Features bank, queries;
    std::int64_t classes = 0;  // class_count of the bank
  };
  BankAndQueries features(const ModelMap& models, const EvaluatorContext& context) const {
    const EvalData& bank_data = eval_data(context, sets_.bank);
    BankAndQueries out;
    out.bank = extract_features(models, sets_.chain, bank_data, context.device, sets_.bank, sets_.labels);
    out.queries = sets_.bank == sets_.queries ? out.bank
                                              : extract_features(models, sets_.chain, eval_data(context, sets_.queries),
                                                                 context.device, sets_.queries, sets_.labels);
    out.classes = class_count(bank_data, out.bank.labels, sets_.bank);
    return out;
  }
  FeatureSetsConfig sets_;
};

}  // namespace refit
