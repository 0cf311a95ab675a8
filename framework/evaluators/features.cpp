#include "evaluators/features.h"

#include <ATen/ATen.h>

#include "refit/error.h"

namespace refit {

Features extract_features(const ModelMap& models, const std::vector<std::string>& chain, const EvalData& data,
                          torch::Device device, const std::string& set_name, const std::string& labels) {
  for (const auto& name : chain) {
    auto it = models.find(name);
    if (it == models.end() || !it->second) throw Error("evaluator: no model named \"" + name + "\"");
  }
  const std::string main = models.at(chain.back())->main_output();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> xs, ys;
  const std::int64_t n = data.batches();
  xs.reserve(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  ys.reserve(xs.capacity());
  for (std::int64_t b = 0; b < n; ++b) {
    Batch batch = data.batch(b);
    if (batch.size() == 0) continue;
    torch::Tensor x = run_chain(models, chain, batch).at(main);
    if (x.dim() == 0 || x.size(0) != batch.size())
      throw Error("evaluator: the models' output for data set \"" + set_name + "\" has shape " + c10::str(x.sizes()) +
                  ", expected one row per sample (" + std::to_string(batch.size()) + ")");
    x = x.reshape({x.size(0), -1}).to(device, torch::kFloat);
    torch::Tensor y = batch.get(labels);
    if (!y.defined() || y.numel() != batch.size() || (y.dim() != 1 && !(y.dim() == 2 && y.size(1) == 1)) ||
        y.is_floating_point() || y.is_complex() || y.scalar_type() == torch::kBool)
      throw Error("evaluator: data set \"" + set_name + "\" must give one integer class index per sample in field \"" +
                  labels + "\"" +
                  (y.defined() ? ", got targets of shape " + c10::str(y.sizes()) : std::string(", got none")));
    xs.push_back(std::move(x));
    ys.push_back(y.reshape({-1}).to(device, torch::kLong));
  }
  if (xs.empty()) throw Error("evaluator: data set \"" + set_name + "\" is empty");
  return Features{torch::cat(xs), torch::cat(ys)};
}

const EvalData& eval_data(const EvaluatorContext& context, const std::string& name) {
  auto it = context.data.find(name);
  if (it == context.data.end() || !it->second)
    throw Error("evaluator: data set \"" + name + "\" was not given (is it under /data/sets?)");
  return *it->second;
}

std::int64_t class_count(const EvalData& data, const torch::Tensor& labels, const std::string& set_name) {
  const std::int64_t lo = labels.min().item<std::int64_t>(), hi = labels.max().item<std::int64_t>();
  if (lo < 0) throw Error("evaluator: data set \"" + set_name + "\" has a negative label (" + std::to_string(lo) + ")");
  const std::int64_t declared = data.num_classes();
  if (declared < 0) return hi + 1;
  if (hi >= declared)
    throw Error("evaluator: data set \"" + set_name + "\" has label " + std::to_string(hi) + " but declares " +
                std::to_string(declared) + " classes");
  return declared;
}

FeatureSetsConfig read_feature_sets_config(const ConfigReader& c, const std::string& default_metric) {
  FeatureSetsConfig f;
  f.chain = c.required<std::vector<std::string>>("models");
  if (c.has("models") && c.raw()["models"].is_array() && f.chain.empty())
    c.error("models", "expected at least one model name");
  for (const char* key : {"bank", "queries"}) {
    std::string v = c.required<std::string>(key);
    if (c.has(key) && c.raw()[key].is_string() && v.empty()) c.error(key, "expected the name of a set under /data/sets");
    (std::string(key) == "bank" ? f.bank : f.queries) = v;
  }
  f.labels = c.optional<std::string>("labels", "labels");
  if (f.labels.empty()) c.error("labels", "expected the name of a data field");
  f.metric = c.optional<std::string>("metric", default_metric);
  if (f.metric.empty()) {
    c.error("metric", "expected a non-empty metric name");
    f.metric = default_metric;
  }
  return f;
}

torch::Tensor l2_normalize(const torch::Tensor& x) {
  return x / x.norm(2, {1}, /*keepdim=*/true).clamp_min(1e-12).expand_as(x);
}

}  // namespace refit
