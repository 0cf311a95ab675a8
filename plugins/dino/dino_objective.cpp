#include "dino_objective.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "dino_loss.h"
#include "refit/error.h"

namespace refit::dino {

DinoObjectiveOptions DinoObjectiveOptions::from_config(const ConfigReader& c) {
  DinoObjectiveOptions o;
  o.student = c.required<std::vector<std::string>>("student");
  o.teacher = c.required<std::vector<std::string>>("teacher");
  if (c.has("student") && o.student.empty()) c.error("student", "expected at least one model name");
  if (c.has("teacher") && o.teacher.empty()) c.error("teacher", "expected at least one model name");
  if (c.has("global_crops")) o.global_crops = c.number_in<std::int64_t>("global_crops", 2, 1, 64);  // else: as the data says
  o.student_temperature = c.number_in<double>("student_temperature", o.student_temperature, 1e-4, 100.0);
  o.teacher_temperature = c.number_in<double>("teacher_temperature", o.teacher_temperature, 1e-4, 100.0);
  o.warmup_teacher_temperature = c.number_in<double>("warmup_teacher_temperature", o.teacher_temperature, 1e-4, 100.0);
  o.warmup_teacher_temperature_iterations =
      c.number_in<std::int64_t>("warmup_teacher_temperature_iterations", 0, 0, INT64_MAX);
  o.center_momentum = c.number_in<double>("center_momentum", o.center_momentum, 0.0, 1.0);
  return o;
}

std::vector<std::string> DinoObjective::required_fields(const ModelMap& models) const {
  // The crops are the chains' primary inputs; other inputs come from the data.
  std::vector<std::string> fields{"global_crop.0"};
  for (const auto* chain : {&options_.student, &options_.teacher})
    for (const auto& f : chain_fields(models, *chain, /*first_primary=*/false))
      if (std::find(fields.begin(), fields.end(), f) == fields.end()) fields.push_back(f);
  return fields;
}

std::vector<std::string> DinoObjective::required_models() const {
  std::vector<std::string> all = options_.student;
  all.insert(all.end(), options_.teacher.begin(), options_.teacher.end());
  return all;
}

namespace {

/// Runs `chain` over views[begin, end): the first model once per run of equally-sized views
/// (crops of one size batched together, as DINO's MultiCropWrapper), the rest once on all.
torch::Tensor run_views(const ModelMap& models, const std::vector<std::string>& chain, const Batch& batch,
                        const std::vector<torch::Tensor>& views, std::size_t begin, std::size_t end) {
  std::vector<torch::Tensor> features;
  const std::vector<std::string> first{chain.front()};
  for (std::size_t i = begin; i < end;) {
    std::size_t j = i + 1;
    while (j < end && views[j].sizes() == views[i].sizes()) ++j;
    std::vector<torch::Tensor> group(views.begin() + i, views.begin() + j);
    const Model& m = model_named(models, chain.front());
    features.push_back(run_chain(models, first, batch, at::cat(group, 0)).at(m.main_output()));
    i = j;
  }
  torch::Tensor x = features.size() == 1 ? features.front() : at::cat(features, 0);
  if (chain.size() == 1) return x;
  const std::vector<std::string> rest(chain.begin() + 1, chain.end());
  Fields out = run_chain(models, rest, batch, x);
  return out.at(model_named(models, chain.back()).main_output());
}

}  // namespace

LossOutput DinoObjective::compute(const ModelMap& models, const Batch& batch, const ObjectiveContext& context) {
  // Multi-crop views: the global crops first, then the local ones (fields "global_crop.<i>",
  // "local_crop.<i>" written by the data's multi_crop).
  std::vector<torch::Tensor> all = numbered_fields(batch, "global_crop");
  const auto globals = static_cast<std::int64_t>(all.size());
  for (auto& t : numbered_fields(batch, "local_crop")) all.push_back(std::move(t));
  const auto views = static_cast<std::int64_t>(all.size());
  if (options_.global_crops > 0 && options_.global_crops != globals)
    throw Error("dino: global_crops is " + std::to_string(options_.global_crops) + " but the data's multi_crop makes " +
                std::to_string(globals) + " global crops; remove /objective/config/global_crops or make them agree");
  if (globals < 1 || views < 2)
    throw Error("dino: a batch needs multi-crop views (fields global_crop.0, ... and local_crop.0, ...; at least 2 "
                "views, 1 global), got " +
                std::to_string(globals) + " global and " + std::to_string(views - globals) +
                " local (fields: " + batch.list() + "); set \"multi_crop\" in the training data's config");
  const std::int64_t b = batch.size();
  torch::Tensor student = run_views(models, options_.student, batch, all, 0, all.size());
  torch::Tensor teacher;
  {
    torch::NoGradGuard no_grad;
    teacher = run_views(models, options_.teacher, batch, all, 0, static_cast<std::size_t>(globals));
  }
  if (!center_.defined()) center_ = torch::zeros({1, teacher.size(1)}, teacher.options().dtype(torch::kFloat));
  // A restored centre arrives on the CPU (checkpoints are read there): move it once.
  if (center_.device() != teacher.device()) center_ = center_.to(teacher.device());
  if (center_.size(1) != teacher.size(1))
    throw Error("dino: the centre has " + std::to_string(center_.size(1)) + " dimensions but the teacher outputs " +
                std::to_string(teacher.size(1)) + " (a checkpoint of another head?)");
  if (!temperature_.defined()) temperature_ = torch::zeros({}, teacher.options().dtype(torch::kFloat));
  set_temperature(context.state.counters.iteration);
  torch::Tensor loss = dino_loss(student, teacher, center_, options_.student_temperature, temperature_, views, globals);
  if (context.training) {
    // The centre moves once per update (on_optimizer_step_end) from the whole window: here the
    // window's sums grow, in place (a captured step adds to the tensors every replay).
    if (!window_sum_.defined()) window_sum_ = torch::zeros_like(center_);
    if (window_sum_.device() != center_.device()) window_sum_ = window_sum_.to(center_.device());
    if (!window_rows_.defined()) window_rows_ = torch::zeros({}, center_.options());
    if (window_rows_.device() != center_.device()) window_rows_ = window_rows_.to(center_.device());
    window_sum_.add_(teacher.detach().to(torch::kFloat).sum(0, /*keepdim=*/true));
    window_rows_.add_(static_cast<double>(teacher.size(0)));
  }
  return LossOutput{loss * static_cast<double>(b), b, {}};
}

void DinoObjective::on_optimizer_step_end(const TrainState& state, const StepResult& result, TrainerControl&) {
  if (!window_rows_.defined() || !center_.defined()) return;  // no training forward yet
  torch::NoGradGuard no_grad;
  // Data-parallel: the whole world's window, so that every rank moves the centre as one process
  // reading the global batch would.
  if (state.collectives) state.collectives->all_reduce_sum({window_sum_, window_rows_});
  torch::Tensor next = updated_center(center_, window_sum_, window_rows_, options_.center_momentum);
  if (result.skipped.defined()) next = at::where(result.skipped.to(center_.device()), center_, next);
  center_.copy_(next);
  window_sum_.zero_();
  window_rows_.zero_();
}

void DinoObjective::set_temperature(std::int64_t iteration) {
  if (!temperature_.defined()) return;  // created at the first forward, on the outputs' device
  const double t = teacher_temperature(options_.warmup_teacher_temperature, options_.teacher_temperature,
                                       options_.warmup_teacher_temperature_iterations, iteration);
  if (t == temperature_value_) return;
  temperature_.fill_(t);
  temperature_value_ = t;
}

void DinoObjective::prepare_step(const ObjectiveContext& context) { set_temperature(context.state.counters.iteration); }

StateDict DinoObjective::state_dict() const {
  if (!center_.defined()) return {};
  StateDict s{{"center", center_}};
  // Inside an accumulation window the sums so far are part of the state (a resume continues the window).
  if (window_sum_.defined()) s["window_sum"] = window_sum_, s["window_rows"] = window_rows_;
  return s;
}

void DinoObjective::load_state_dict(const StateDict& state) {
  auto it = state.find("center");
  if (it != state.end()) center_ = it->second.to(torch::kFloat);
  auto sum = state.find("window_sum"), rows = state.find("window_rows");
  if (sum != state.end() && rows != state.end()) {
    window_sum_ = sum->second.to(torch::kFloat);
    window_rows_ = rows->second.to(torch::kFloat).reshape({});
  }
}

}  // namespace refit::dino
