#include "train/evaluation.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "precision/autocast_guard.h"
#include "refit/error.h"
#include "train/rng.h"

namespace refit {

Evaluation::Evaluation(EvaluationParts parts) : parts_(std::move(parts)) {
  if (!parts_.models || !parts_.objective) throw Error("evaluation: models and an objective are required");
}

EvalResult Evaluation::evaluate(const DataLoader& loader, const std::string& split, const TrainState& state) {
  return run(&loader, split, false, state);
}

EvalResult Evaluation::validate(const TrainState& state) { return run(parts_.val.get(), "val", true, state); }

EvalResult Evaluation::run(const DataLoader* loader, const std::string& split, bool run_evaluators,
                           const TrainState& state) {
  // Scoped seed: evaluation may draw random numbers (dropout is off, but augmentations or
  // objectives might); the training stream continues afterwards as if evaluation never ran.
  const auto rng_state = capture_rng();
  seed_all(parts_.seed + 0x5EED);
  std::vector<std::pair<ModelPtr, bool>> modes;
  for (const auto& m : parts_.models->models()) {
    modes.emplace_back(m.model, m.model->is_training());
    m.model->eval();
  }
  ModelMap models = parts_.models->model_map();
  torch::NoGradGuard no_grad;
  EvalResult r;
  r.split = split;
  r.counters = state.counters;
  if (loader) {
    Sums sums = objective_sums(*loader, models, state);
    if (parts_.group) reduce_over_ranks(sums, split);
    r.count = sums.count;
    const double denom = static_cast<double>(std::max<std::int64_t>(1, sums.count));
    r.metrics["loss"] = sums.loss.item<double>() / denom;
    for (auto& kv : sums.metrics) r.metrics[kv.first] = kv.second.item<double>() / denom;
    parts_.objective->add_derived_metrics(r.metrics);
  }
  if (run_evaluators) add_evaluator_metrics(r, models, state);
  for (auto& m : modes) m.first->train(m.second);
  restore_rng(rng_state);
  return r;
}

Evaluation::Sums Evaluation::objective_sums(const DataLoader& loader, const ModelMap& models, const TrainState& state) {
  Sums sums;
  sums.loss = torch::zeros({}, torch::TensorOptions().device(parts_.device));
  for (std::int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    // Counted on the host batch, as the training loop counts (Objective::count).
    Batch host = loader.batch(0, i);
    const std::int64_t count = parts_.objective->count(host);
    Batch b = to_device(std::move(host), parts_.device);
    LossOutput out;
    {
      AutocastGuard guard(parts_.device.type(), autocast_dtype(parts_.precision), uses_autocast(parts_.precision));
      out = parts_.objective->compute(models, b, ObjectiveContext{state, false});
    }
    sums.loss += out.loss_sum.to(torch::kFloat);
    for (auto& kv : out.metric_sums) {
      auto v = kv.second.to(torch::kFloat);
      auto it = sums.metrics.find(kv.first);
      if (it == sums.metrics.end()) sums.metrics.emplace(kv.first, v);
      else
        it->second = it->second + v;
    }
    sums.count += count;
  }
  return sums;
}

void Evaluation::reduce_over_ranks(Sums& sums, const std::string& split) {
  std::vector<torch::Tensor> parts{sums.loss.to(torch::kDouble).reshape({1})};
  for (auto& kv : sums.metrics) parts.push_back(kv.second.to(torch::kDouble).reshape({1}));
  parts.push_back(torch::full({1}, static_cast<double>(sums.count), parts[0].options()));
  auto packed = at::cat(parts);
  // Every rank must report the same metrics. The largest and the smallest count of names
  // (max of n and of -n) reach every rank, so that all of them refuse a mismatch together.
  const auto n = static_cast<double>(sums.metrics.size());
  auto extremes = torch::tensor({n, -n}, packed.options());
  parts_.group->all_reduce_max(extremes, "the " + split + " evaluation");
  auto host_extremes = extremes.cpu();
  const double most = host_extremes[0].item<double>(), fewest = -host_extremes[1].item<double>();
  if (most != fewest)
    throw Error("distributed: the ranks report different numbers of metrics in the " + split + " evaluation (" +
                std::to_string(static_cast<long long>(fewest)) + " to " + std::to_string(static_cast<long long>(most)) +
                "; this rank: " + std::to_string(sums.metrics.size()) + ")");
  parts_.group->all_reduce_sum({packed}, "the " + split + " evaluation");
  packed = packed.cpu();
  sums.loss = packed[0];
  std::size_t i = 1;
  for (auto& kv : sums.metrics) kv.second = packed[static_cast<std::int64_t>(i++)];
  sums.count = static_cast<std::int64_t>(packed[static_cast<std::int64_t>(i)].item<double>());
}

void Evaluation::add_evaluator_metrics(EvalResult& r, const ModelMap& models, const TrainState& state) {
  EvaluatorContext ctx{state, parts_.device, parts_.seed + 0xE7A1, {}};
  for (const auto& [name, data] : parts_.eval_sets) ctx.data[name] = data.get();
  AutocastGuard guard(parts_.device.type(), autocast_dtype(parts_.precision), uses_autocast(parts_.precision));
  for (const auto& e : parts_.evaluators)
    for (const auto& [metric, value] : e->evaluate(models, ctx)) {
      if (r.metrics.count(metric))
        throw Error("evaluators: metric \"" + metric + "\" is reported twice (give one evaluator another \"metric\" name)");
      r.metrics[metric] = value;
    }
}

}  // namespace refit
