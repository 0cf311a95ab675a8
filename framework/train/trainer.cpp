#include "train/trainer.h"

#include <cstdio>
#include <optional>

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "precision/autocast_guard.h"
#include "refit/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_recovery.h"
#include "train/optimizer.h"
#include "train/rng.h"
#include "train/schedule.h"
#include "train/step_executor.h"

namespace refit {

std::int64_t steps_for(const Duration& d, std::int64_t batches_per_epoch, std::int64_t accumulation) {
  switch (d.unit) {
    case TimeUnit::step: return d.count;
    case TimeUnit::iteration: return d.count * accumulation;
    case TimeUnit::epoch: return d.count * batches_per_epoch;
  }
  return 0;
}

namespace {

/// True when `d` is due after the given counters changed (step/iteration/epoch just ended).
bool due(const std::optional<Duration>& d, const Counters& c, bool step_ended, bool iteration_ended, bool epoch_ended) {
  if (!d) return false;
  switch (d->unit) {
    case TimeUnit::step: return step_ended && c.step % d->count == 0;
    case TimeUnit::iteration: return iteration_ended && c.iteration % d->count == 0;
    case TimeUnit::epoch: return epoch_ended && c.epoch % d->count == 0;
  }
  return false;
}

GradScalerOptions scaler_options(GradScalerOptions o, Precision p) {
  o.enabled = uses_grad_scaler(p);
  return o;
}

torch::Tensor total_norm(const std::vector<torch::Tensor>& grads, torch::Device device) {
  if (grads.empty()) return torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2);
  for (auto& n : norms) n = n.to(torch::kFloat);
  return at::linalg_vector_norm(at::stack(norms), 2);
}

}  // namespace

Trainer::Trainer(TrainerParts parts)
    : parts_(std::move(parts)), scaler_(scaler_options(parts_.training.grad_scaler, parts_.precision), parts_.device) {
  if (!parts_.models || !parts_.train || !parts_.objective || !parts_.optimizer)
    throw Error("trainer: models, training data, objective and optimizer are required");
  objective_hooks_ = std::dynamic_pointer_cast<Callback>(parts_.objective);
  for (const auto& m : parts_.models->models())
    for (const auto& p : m.parameters)
      if (p.trainable) trainable_.push_back(p.tensor);
  if (parts_.group && parts_.group->size() > 1) {
    collectives_ = std::make_unique<GroupCollectives>(*parts_.group);
    state_.collectives = collectives_.get();
  }
  state_.steps_per_epoch = parts_.train->batches_per_epoch();
  if (state_.steps_per_epoch == 0)
    throw Error(parts_.group && parts_.group->size() > 1
                    ? "the training set has fewer samples than one global batch (batch_size " +
                          std::to_string(parts_.training.batch_size) + " per rank x " +
                          std::to_string(parts_.group->size()) + " ranks)"
                    : "the training set has fewer samples than one batch (batch_size " +
                          std::to_string(parts_.training.batch_size) + ", drop_last on)");
  state_.max_steps = steps_for(parts_.training.duration, state_.steps_per_epoch, parts_.training.gradient_accumulation);
  const std::int64_t k = parts_.training.gradient_accumulation;
  state_.max_iterations = (state_.max_steps + k - 1) / k;
  graph_plan_ = plan_cuda_graph();
  // Graph mode keeps learning rates on the device and gradients allocated (zeroed in place) from
  // the first eager step on, so that warm-up steps, eager fallbacks and replays compute alike.
  if (graph_plan_ == "on") {
    parts_.optimizer->use_device_lr();
    persistent_grads_ = true;
  }
  schedule_ = std::make_unique<LrSchedule>(parts_.scheduler, parts_.training.schedule_counts, state_.max_iterations,
                                           *parts_.optimizer, state_.counters);
  // Skips decided on the device and a schedule of applied updates: the update advances the
  // schedule on the device too (train/schedule.h), so the step still reads nothing on the host.
  if (parts_.optimizer->skips_on_device() && parts_.training.non_finite == NonFinitePolicy::skip &&
      parts_.training.schedule_counts == ScheduleCounts::applied_updates) {
    if (!parts_.optimizer->has_device_lr()) parts_.optimizer->use_device_lr();
    schedule_->count_on_device(parts_.device);
  }
}

void Trainer::sync_skip_count() {
  if (!pending_skips_.defined()) return;
  const auto skipped = pending_skips_.item<std::int64_t>();
  if (skipped == 0) return;
  state_.counters.skipped_iterations += skipped;
  pending_skips_.zero_();
  // The device already holds the schedule on those skips; the host's learning rates (reports)
  // count them from now on.
  if (schedule_->counts_on_device()) schedule_->after_update();
}

std::vector<torch::Tensor> Trainer::trainable_grads() const {
  std::vector<torch::Tensor> grads;
  for (const auto& p : trainable_)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

void Trainer::forward_backward(const ModelMap& models, const Batch& batch, std::int64_t window_count, bool hooks,
                               StepResult& result) {
  if (hooks) emit([&](Callback& c) { c.on_compute_loss_begin(state_, control_); });
  LossOutput out;
  {
    AutocastGuard guard(parts_.device.type(), autocast_dtype(parts_.precision), uses_autocast(parts_.precision));
    out = parts_.objective->compute(models, batch, ObjectiveContext{state_, true});
  }
  auto loss_sum = out.loss_sum.to(torch::kFloat);  // the loss is handed on in fp32
  if (hooks) emit([&](Callback& c) { c.on_compute_loss_end(state_, control_); });
  if (hooks) emit([&](Callback& c) { c.on_backward_begin(state_, control_); });
  scaler_.scale(loss_sum / static_cast<double>(window_count)).backward();
  if (hooks) emit([&](Callback& c) { c.on_backward_end(state_, control_); });
  result.loss = (loss_sum / static_cast<double>(std::max<std::int64_t>(1, out.count))).detach();
  result.count = out.count;
}

void Trainer::update_on_device(StepResult& result, bool hooks) {
  if (parts_.group) {
    // Data-parallel: one sum of the (still scaled) gradients per update, never inside a window.
    // Every rank then holds the global batch's gradients, so the non-finite check, the norm,
    // clipping, the skip decision and the optimizer step below agree on every rank. A gradient
    // a rank did not produce (a parameter its micro-batches did not reach) is zeros.
    std::vector<torch::Tensor> all;
    for (auto& p : trainable_) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      all.push_back(p.grad());
    }
    parts_.group->all_reduce_sum(all, "the gradient all-reduce of iteration " + std::to_string(state_.counters.iteration));
  }
  auto grads = trainable_grads();
  result.scale_before = scaler_.scale_tensor().clone();
  scaler_.unscale(grads);  // unscale first: the hook, the norm and clipping see true gradients
  if (hooks) emit([&](Callback& c) { c.on_before_optimizer_step(state_, control_); });

  // The norm before any clipping. Without a scaler it is also the non-finite check (one
  // reduction serves both), taken before value clipping, which would turn an inf into ±v.
  result.grad_norm_before = total_norm(grads, scaler_.found_inf().device());
  if (!scaler_.enabled()) scaler_.record_found_inf(result.grad_norm_before.isfinite().logical_not());
  torch::Tensor norm = result.grad_norm_before;
  if (parts_.training.clip_grad_value) {
    double v = *parts_.training.clip_grad_value;
    at::_foreach_clamp_min_(grads, -v);
    at::_foreach_clamp_max_(grads, v);
    // Norm clipping after value clipping scales by the clamped gradients' norm.
    if (parts_.training.clip_grad_norm) norm = total_norm(grads, scaler_.found_inf().device());
    else result.grad_norm_after = total_norm(grads, scaler_.found_inf().device());
  }
  if (parts_.training.clip_grad_norm && !grads.empty()) {
    // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1; no host sync.
    auto coef = (*parts_.training.clip_grad_norm / (norm + 1e-6)).clamp_max(1.0);
    at::_foreach_mul_(grads, coef);
    // ||coef * g|| = coef * ||g||: no second pass over the gradients for the reported figure.
    result.grad_norm_after = norm * coef;
  } else if (!result.grad_norm_after.defined()) {
    result.grad_norm_after = result.grad_norm_before;
  }
  result.skipped = scaler_.found_inf().gt(0).reshape({});

  if (parts_.optimizer->skips_on_device() && parts_.training.non_finite == NonFinitePolicy::skip) {
    // No host read: the fused kernel skips on found_inf, and the skip count accumulates on the
    // device until the loop next reads it (sync_skip_count: log lines, evaluations, checkpoints).
    parts_.optimizer->step(scaler_.found_inf());
    pending_skips_.add_(result.skipped);
    if (schedule_->counts_on_device()) schedule_->advance_on_device(result.skipped);
  } else {
    // The `raise` policy and the unfused optimizers decide on the host: one read per window.
    const bool skip = result.skipped.item<bool>();
    if (skip) {
      result.skip_reason = "non-finite gradients";
      if (parts_.training.non_finite == NonFinitePolicy::raise)
        throw Error("non-finite gradients at iteration " + std::to_string(state_.counters.iteration) + " (step " +
                    std::to_string(state_.counters.step) + "); the weights are untouched. Set "
                    "/training/non_finite to \"skip\" to skip such updates instead");
      ++state_.counters.skipped_iterations;
    } else {
      parts_.optimizer->step();
    }
  }
  scaler_.update();  // once per window, after the step decision
  result.scale_after = scaler_.scale_tensor().clone();
  parts_.optimizer->zero_grad(/*set_to_none=*/!persistent_grads_);
}

void Trainer::refuse_unreduced_objective_state() {
  // State an objective computes from each rank's own batches (DINO's centre, created at its first
  // step) is not summed over the ranks: they would drift apart without a sign. Refused at the
  // start, or at the first update where the state is created lazily, rather than silently wrong.
  if (!parts_.group || parts_.group->size() == 1 || parts_.objective->state_dict().empty() ||
      parts_.objective->reduces_state_across_ranks())
    return;
  throw Error("distributed: the objective keeps state computed from its batches and does not sum it over the "
              "ranks (Objective::reduces_state_across_ranks); train it in one process");
}

void Trainer::finish_update(StepResult& result) {
  if (state_.counters.iteration == 0) refuse_unreduced_objective_state();
  for (std::size_t g = 0; g < parts_.optimizer->group_count(); ++g) result.learning_rates.push_back(parts_.optimizer->lr(g));
  ++state_.counters.iteration;
  schedule_->after_update();
  result.window_complete = true;
  result.counters = state_.counters;
  emit([&](Callback& c) { c.on_optimizer_step_end(state_, result, control_); });
}

std::unique_ptr<StepExecutor> Trainer::make_executor(const ModelMap& models) {
  StepWork work;
  work.forward_backward = [this, &models](const Batch& batch, std::int64_t window_count, bool hooks, StepResult& r) {
    forward_backward(models, batch, window_count, hooks, r);
  };
  work.update = [this](StepResult& r, bool hooks) { update_on_device(r, hooks); };
  work.materialize_state = [this] { parts_.optimizer->materialize_state(); };
  work.trainable = trainable_;
  if (graph_plan_ != "on") return make_eager_executor(std::move(work));
  StepGraphFactory graphs = parts_.make_step_graph;
  if (!graphs) graphs = [device = parts_.device] { return make_cuda_step_graph(device); };
  return make_graph_executor(std::move(work), parts_.device, parts_.training.cuda_graph_warmup, std::move(graphs));
}

std::string Trainer::plan_cuda_graph() const {
  const auto& t = parts_.training;
  if (!t.cuda_graph) return "";
  if (!parts_.optimizer->skips_on_device())
    return "off: the optimizer is not a fused Adam/AdamW (it reads found-inf on the host)";
  if (t.non_finite == NonFinitePolicy::raise) return "off: non_finite \"raise\" reads found-inf on the host every update";
  if (!parts_.objective->graph_safe()) return "off: the objective is not graph-safe (Objective::graph_safe)";
  if (objective_hooks_ && objective_hooks_->needs_inner_step_hooks())
    return "off: the objective needs the hooks inside the step (Callback::needs_inner_step_hooks)";
  for (const auto& c : parts_.callbacks)
    if (c->needs_inner_step_hooks()) return "off: a callback needs the hooks inside the step (Callback::needs_inner_step_hooks)";
  if (parts_.group) return "off: data-parallel runs reduce gradients outside the captured step";
  // Last, so that a recipe tried on a CPU first reports what else would keep graphs off.
  if (!parts_.device.is_cuda() && !parts_.make_step_graph)
    return "off: CUDA graphs need a CUDA device (this run is on " + parts_.device.str() + ")";
  return "on";
}

TrainSummary Trainer::fit() {
  auto started = std::chrono::steady_clock::now();
  const auto& t = parts_.training;
  const std::int64_t k = t.gradient_accumulation;
  ModelMap models = parts_.models->model_map();
  // EMA models (a DINO teacher) give targets: deterministic, so no dropout — eval mode. (Their
  // BatchNorm layers, if any, would use running statistics the EMA does not update.)
  for (auto& m : parts_.models->models()) m.model->train(!m.ema);
  TrainSummary summary;
  if (!parts_.checkpoint_root.empty() || parts_.resume_from) base_fingerprint_ = base_fingerprint(*parts_.models);
  if (parts_.resume_from) {
    CheckpointState restored =
        load_checkpoint(*parts_.resume_from, *parts_.models, state_components(), parts_.fingerprint, t.resume_allow_changes,
                        state_.max_steps);
    state_.counters = restored.counters;
    last_checkpoint_step_ = restored.counters.step;
  }
  if (!parts_.checkpoint_root.empty() && leader()) recover_checkpoints(parts_.checkpoint_root, parts_.retention);
  refuse_unreduced_objective_state();
  if (parts_.group) {
    broadcast_from_leader();
    verify_replicas(/*frozen_too=*/true, "the start");
  }
  schedule_->start();

  emit([&](Callback& c) { c.on_train_begin(state_, control_); });
  if (t.eval_at_start && has_validation() && state_.counters.step == 0) summary.last_eval = validate();
  auto& counters = state_.counters;
  // The device-side skip counter exists on the device-skip path only (other paths count on the
  // host, and sync_skip_count() then reads nothing).
  if (parts_.optimizer->skips_on_device() && t.non_finite == NonFinitePolicy::skip)
    pending_skips_ = torch::zeros({}, scaler_.found_inf().options().dtype(torch::kLong));
  std::unique_ptr<StepExecutor> executor = make_executor(models);
  std::vector<torch::Tensor> buffers;
  if (parts_.group)
    for (const auto& m : parts_.models->models())
      if (!m.ema)
        for (auto& b : m.model->named_buffers()) buffers.push_back(b.value());
  bool evaluation_due = false, checkpoint_due = false;
  Prefetcher batches_ahead(*parts_.train, counters.step - counters.step % k, state_.max_steps, parts_.prefetch);
  while (counters.step < state_.max_steps && !control_.stop_requested()) {
    // Windows are aligned to multiples of k from step 0, so a run resumed inside a window
    // rebuilds that window (its batches are a function of the step) and continues it.
    const std::int64_t window_start = counters.step - counters.step % k;
    const std::int64_t window = std::min(k, state_.max_steps - window_start);
    // Fetch the whole window first: its normaliser (samples or tokens) must be known before the
    // first backward so that k micro-batches give the gradients of one k-times-larger batch.
    std::vector<Batch> batches;
    std::int64_t window_count = 0, window_samples = 0;
    for (std::int64_t i = 0; i < window; ++i) {
      Batch b = to_device(batches_ahead.get(window_start + i), parts_.device);
      window_count += parts_.objective->count(b);
      window_samples += b.size();
      batches.push_back(std::move(b));
    }
    // Data-parallel: the normaliser is the whole world's count, so that the ranks' summed
    // gradients are those of one global batch; the samples counter counts the world's.
    std::int64_t other_ranks_samples = 0;
    if (parts_.group) {
      auto [count, samples] = global_window(window_count, window_samples);
      window_count = count;
      other_ranks_samples = samples - window_samples;
    }
    // Data-parallel: rank 0's buffers (BatchNorm statistics) to every rank at each window's
    // start, as PyTorch's DDP does before each forward; checkpoints keep rank 0's.
    if (parts_.group && !buffers.empty() && counters.step == window_start)
      parts_.group->broadcast(buffers, 0, "the buffer broadcast of iteration " + std::to_string(counters.iteration));
    executor->begin_window(batches);
    for (std::int64_t i = counters.step - window_start; i < window; ++i) {
      const Batch& batch = batches[i];
      const bool window_end = i + 1 == window;
      if (counters.step % state_.steps_per_epoch == 0) emit([&](Callback& c) { c.on_epoch_begin(state_, control_); });
      emit([&](Callback& c) { c.on_step_begin(state_, control_); });
      parts_.objective->prepare_step(ObjectiveContext{state_, true});  // outside any capture
      StepResult result = executor->forward_backward(batch, window_count, window_end, window, k, counters.step);
      // Counted before the eager update, whose hooks see this micro-batch counted.
      ++counters.step;
      counters.samples += batch.size();
      if (window_end) {
        counters.samples += other_ranks_samples;
        executor->update(result);
        finish_update(result);
      }
      // Counters are exact where the progress line reads them (and before evaluations,
      // checkpoints and the end); in between, device-decided skips are pending.
      if (counters.step % t.log_every == 0 || counters.step == state_.max_steps) sync_skip_count();
      result.counters = counters;
      emit([&](Callback& c) { c.on_step_end(state_, result, control_); });

      const bool epoch_end = counters.step % state_.steps_per_epoch == 0;
      if (epoch_end) {
        ++counters.epoch;
        emit([&](Callback& c) { c.on_epoch_end(state_, control_); });
      }
      evaluation_due |=
          has_validation() && (due(t.eval_every, counters, true, window_end, epoch_end) || control_.evaluation_requested());
      checkpoint_due |= !parts_.checkpoint_root.empty() &&
                        (due(t.checkpoint_every, counters, true, window_end, epoch_end) || control_.checkpoint_requested());
      control_.clear_requests();
      // Data-parallel: what falls due inside an accumulation window waits for its end. Until the
      // window's all-reduce each rank's gradients (and an objective's window sums) are its own, and
      // a checkpoint written by rank 0 would hold rank 0's alone (docs/distributed.md).
      if (parts_.group && !window_end) continue;
      const bool evaluate_now = evaluation_due;
      if (evaluate_now) summary.last_eval = validate();
      checkpoint_due |= !parts_.checkpoint_root.empty() && control_.checkpoint_requested();  // asked for at the evaluation
      control_.clear_requests();
      // With keep_best every evaluation leaves a checkpoint of the weights it scored (train/retention.h).
      if (checkpoint_due || (evaluate_now && !parts_.checkpoint_root.empty() && checkpoint_after_evaluation(parts_.retention)))
        save_checkpoint_now();
      evaluation_due = checkpoint_due = false;
      if (control_.stop_requested()) break;
    }
  }
  sync_skip_count();
  if (!graph_plan_.empty()) graph_plan_ = executor->report();
  if (has_validation() && (!summary.last_eval || summary.last_eval->counters.step != counters.step))
    summary.last_eval = validate();
  if (!parts_.checkpoint_root.empty() && last_checkpoint_step_ != counters.step) save_checkpoint_now();
  else if (parts_.group) verify_replicas(/*frozen_too=*/false, "the end of training");
  emit([&](Callback& c) { c.on_train_end(state_, control_); });
  summary.counters = counters;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return summary;
}

void Trainer::broadcast_from_leader() {
  std::vector<torch::Tensor> tensors;
  for (const auto& m : parts_.models->models()) {
    for (const auto& p : m.parameters)
      if (p.trainable) tensors.push_back(p.tensor.detach());
    for (auto& b : m.model->named_buffers()) tensors.push_back(b.value());
  }
  torch::NoGradGuard no_grad;
  parts_.group->broadcast(tensors, 0, "the broadcast of rank 0's weights");
}

void Trainer::verify_replicas(bool frozen_too, const std::string& when) {
  torch::NoGradGuard no_grad;
  std::vector<std::string> names;
  std::vector<torch::Tensor> sums;
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    // Two sums per tensor, the second weighted by position, so that a permutation shows too.
    auto flat = t.detach().reshape({-1}).to(torch::kDouble);
    auto weights = at::arange(flat.numel(), flat.options()).remainder(1009).add_(1);
    names.push_back(name);
    sums.push_back(at::stack({flat.sum(), (flat * weights).sum()}));
  };
  for (const auto& m : parts_.models->models()) {
    for (const auto& p : m.parameters)
      if (p.trainable || frozen_too) add(m.spec.name + "/" + p.path, p.tensor);
    // Buffers that training changes (BatchNorm statistics) are each rank's own within a window,
    // as in PyTorch's DDP; they are made rank 0's at every window's start.
    if (frozen_too)
      for (auto& b : m.model->named_buffers()) add(m.spec.name + "/" + b.key(), b.value());
  }
  if (sums.empty()) return;
  auto mine = at::stack(sums);
  auto leaders = mine.clone();
  parts_.group->broadcast({leaders}, 0, "the replica check at " + when);
  auto differs = mine.ne(leaders).any(1).cpu();
  auto flags = torch::zeros({parts_.group->size()}, mine.options());
  if (differs.any().item<bool>()) flags[parts_.group->rank()] = 1.0;
  parts_.group->all_reduce_max(flags, "the replica check at " + when);
  auto host = flags.cpu();
  std::string ranks;
  for (int r = 0; r < parts_.group->size(); ++r)
    if (host[r].item<double>() > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (ranks.empty()) return;
  std::string first;
  for (std::int64_t i = 0; i < differs.size(0); ++i)
    if (differs[i].item<bool>()) {
      first = " (here: " + names[static_cast<std::size_t>(i)] + ")";
      break;
    }
  throw Error("distributed: at " + when + ", the weights or buffers of rank(s) " + ranks +
              " differ from rank 0's" + first + ". Every rank must load the same weights files and run the same recipe");
}

std::pair<std::int64_t, std::int64_t> Trainer::global_window(std::int64_t count, std::int64_t samples) {
  auto t = torch::tensor({count, samples}, torch::TensorOptions().dtype(torch::kLong)).to(parts_.device);
  parts_.group->all_reduce_sum({t}, "the sample count of iteration " + std::to_string(state_.counters.iteration));
  auto host = t.cpu();
  return {host[0].item<std::int64_t>(), host[1].item<std::int64_t>()};
}

StateComponents Trainer::state_components() {
  StateComponents c{{"optimizer", parts_.optimizer.get()}, {"scaler", &scaler_}, {"rng", &rng_},
                    {"objective", parts_.objective.get()}, {"schedule", schedule_.get()}};
  for (std::size_t i = 0; i < parts_.callbacks.size(); ++i)
    c.emplace_back("callback/" + std::to_string(i), parts_.callbacks[i].get());
  return c;
}

void Trainer::save_checkpoint_now() {
  sync_skip_count();
  CheckpointState cs;
  cs.counters = state_.counters;
  cs.in_window = state_.counters.step % parts_.training.gradient_accumulation != 0;
  cs.fingerprint = parts_.fingerprint;
  // Ranked by an evaluation of these weights only: one at this very step.
  if (last_eval_ && last_eval_->counters.step == state_.counters.step) {
    auto it = last_eval_->metrics.find(parts_.retention.metric);
    if (it != last_eval_->metrics.end()) cs.metric = it->second, cs.metric_step = last_eval_->counters.step;
  }
  if (parts_.group) verify_replicas(/*frozen_too=*/false, "the checkpoint at step " + std::to_string(state_.counters.step));
  // Rank 0 writes; the others hold the same state (just verified) and carry on.
  std::filesystem::path dir = parts_.checkpoint_root / checkpoint_dir_name(state_.counters.step);
  if (leader()) {
    dir = save_checkpoint(parts_.checkpoint_root, *parts_.models, base_fingerprint_, state_components(), cs);
    apply_retention(parts_.checkpoint_root, parts_.retention);
  }
  last_checkpoint_step_ = state_.counters.step;
  emit([&](Callback& c) { c.on_checkpoint_saved(state_, dir.string(), control_); });
}

EvalResult Trainer::evaluate(const DataLoader& loader, const std::string& split) {
  return evaluate_impl(&loader, split, false);
}

EvalResult Trainer::validate() { return evaluate_impl(parts_.val.get(), "val", true); }

EvalResult Trainer::evaluate_impl(const DataLoader* loader, const std::string& split, bool run_evaluators) {
  sync_skip_count();
  emit([&](Callback& c) { c.on_evaluation_begin(state_, control_); });
  // Scoped seed: evaluation may draw random numbers (dropout is off, but augmentations or
  // objectives might); the training stream continues afterwards as if evaluation never ran.
  const auto rng_state = capture_rng();
  seed_all(parts_.training.seed + 0x5EED);
  std::vector<std::pair<ModelPtr, bool>> modes;
  for (const auto& m : parts_.models->models()) {
    modes.emplace_back(m.model, m.model->is_training());
    m.model->eval();
  }
  ModelMap models = parts_.models->model_map();
  torch::NoGradGuard no_grad;
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(parts_.device));
  std::map<std::string, torch::Tensor> metric_sums;
  std::int64_t count = 0;
  const std::int64_t batches = loader ? loader->batches_per_epoch() : 0;
  for (std::int64_t i = 0; i < batches; ++i) {
    Batch b = to_device(loader->batch(0, i), parts_.device);
    LossOutput out;
    {
      AutocastGuard guard(parts_.device.type(), autocast_dtype(parts_.precision), uses_autocast(parts_.precision));
      out = parts_.objective->compute(models, b, ObjectiveContext{state_, false});
    }
    loss_sum += out.loss_sum.to(torch::kFloat);
    for (auto& kv : out.metric_sums) {
      auto v = kv.second.to(torch::kFloat);
      auto it = metric_sums.find(kv.first);
      if (it == metric_sums.end()) metric_sums.emplace(kv.first, v);
      else it->second = it->second + v;
    }
    count += out.count;
  }
  if (parts_.group && loader) {
    // Data-parallel: each rank evaluated its own block of the data; the sums are the world's.
    std::vector<torch::Tensor> parts{loss_sum.to(torch::kDouble).reshape({1})};
    for (auto& kv : metric_sums) parts.push_back(kv.second.to(torch::kDouble).reshape({1}));
    parts.push_back(torch::full({1}, static_cast<double>(count), parts[0].options()));
    auto packed = at::cat(parts);
    // Every rank must report the same metrics. The largest and the smallest count of names
    // (max of n and of -n) reach every rank, so that all of them refuse a mismatch together.
    const auto n = static_cast<double>(metric_sums.size());
    auto extremes = torch::tensor({n, -n}, packed.options());
    parts_.group->all_reduce_max(extremes, "the " + split + " evaluation");
    auto host_extremes = extremes.cpu();
    const double most = host_extremes[0].item<double>(), fewest = -host_extremes[1].item<double>();
    if (most != fewest)
      throw Error("distributed: the ranks report different numbers of metrics in the " + split + " evaluation (" +
                  std::to_string(static_cast<long long>(fewest)) + " to " + std::to_string(static_cast<long long>(most)) +
                  "; this rank: " + std::to_string(metric_sums.size()) + ")");
    parts_.group->all_reduce_sum({packed}, "the " + split + " evaluation");
    packed = packed.cpu();
    loss_sum = packed[0];
    std::size_t i = 1;
    for (auto& kv : metric_sums) kv.second = packed[static_cast<std::int64_t>(i++)];
    count = static_cast<std::int64_t>(packed[static_cast<std::int64_t>(i)].item<double>());
  }
  EvalResult r;
  r.split = split;
  r.counters = state_.counters;
  r.count = count;
  const double denom = static_cast<double>(std::max<std::int64_t>(1, count));
  if (loader) {
    r.metrics["loss"] = loss_sum.item<double>() / denom;
    for (auto& kv : metric_sums) r.metrics[kv.first] = kv.second.item<double>() / denom;
  }
  if (run_evaluators) {
    EvaluatorContext ctx{state_, parts_.device, parts_.training.seed + 0xE7A1, {}};
    for (const auto& [name, data] : parts_.eval_sets) ctx.data[name] = data.get();
    AutocastGuard guard(parts_.device.type(), autocast_dtype(parts_.precision), uses_autocast(parts_.precision));
    for (const auto& e : parts_.evaluators)
      for (const auto& [metric, value] : e->evaluate(models, ctx)) {
        if (r.metrics.count(metric))
          throw Error("evaluators: metric \"" + metric + "\" is reported twice (give one evaluator another \"metric\" name)");
        r.metrics[metric] = value;
      }
  }
  for (auto& m : modes) m.first->train(m.second);
  restore_rng(rng_state);
  if (split == "val") last_eval_ = r;
  emit([&](Callback& c) { c.on_evaluation_end(state_, r, control_); });
  return r;
}

}  // namespace refit
