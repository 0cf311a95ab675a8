#include "train/trainer.h"

#include <cstdio>
#include <optional>
#include <tuple>

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "precision/autocast_guard.h"
#include "refit/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_recovery.h"
#include "train/evaluation.h"
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
  objective_hooks_ = parts_.objective->loop_hooks();
  for (const auto& m : parts_.models->models())
    for (const auto& p : m.parameters)
      if (p.trainable) trainable_.push_back(p.tensor);
  replicas_ = std::make_unique<Replicas>(parts_.group, *parts_.models, parts_.device);
  state_.collectives = replicas_->collectives();
  evaluation_ = std::make_unique<Evaluation>(EvaluationParts{parts_.models, parts_.objective, parts_.val, parts_.evaluators,
                                                             parts_.eval_sets, parts_.precision, parts_.device,
                                                             parts_.training.seed, parts_.group});
  state_.steps_per_epoch = parts_.train->batches_per_epoch();
  if (state_.steps_per_epoch == 0)
    throw Error(replicas_->size() > 1 ? "the training set has fewer samples than one global batch (batch_size " +
                                            std::to_string(parts_.training.batch_size) + " per rank x " +
                                            std::to_string(replicas_->size()) + " ranks)"
                                      : "the training set has fewer samples than one batch (batch_size " +
                                            std::to_string(parts_.training.batch_size) + ", drop_last on)");
  state_.max_steps = steps_for(parts_.training.duration, state_.steps_per_epoch, parts_.training.gradient_accumulation);
  const std::int64_t k = parts_.training.gradient_accumulation;
  state_.max_iterations = (state_.max_steps + k - 1) / k;
  if (parts_.training.early_stopping.enabled) {
    early_stopping_ = std::make_unique<EarlyStopping>(parts_.training.early_stopping);
    if (parts_.training.early_stopping.restore_best) best_weights_ = std::make_unique<BestWeights>(*parts_.models);
  }
  std::tie(graph_mode_, graph_note_) = plan_cuda_graph();
  // Graph mode keeps learning rates on the device and gradients allocated (zeroed in place) from
  // the first eager step on, so that warm-up steps, eager fallbacks and replays compute alike.
  if (graph_mode_ == GraphMode::capture) {
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
  result.loss = (loss_sum / static_cast<double>(std::max<std::int64_t>(1, micro_batch_count_))).detach();
  result.count = micro_batch_count_;
}

void Trainer::update_on_device(StepResult& result, bool hooks) {
  // Data-parallel: the window's gradients summed over the ranks (never inside a window).
  replicas_->reduce_gradients(trainable_, state_.counters.iteration);
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
    else
      result.grad_norm_after = total_norm(grads, scaler_.found_inf().device());
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
                    std::to_string(state_.counters.step) +
                    "); the weights are untouched. Set "
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

void Trainer::finish_update(StepResult& result) {
  if (state_.counters.iteration == 0) replicas_->refuse_unreduced_state(*parts_.objective);
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
  if (graph_mode_ != GraphMode::capture) return make_eager_executor(std::move(work));
  StepGraphFactory graphs = parts_.make_step_graph;
  if (!graphs) graphs = [device = parts_.device] { return make_cuda_step_graph(device); };
  return make_graph_executor(std::move(work), parts_.device, parts_.training.cuda_graph_warmup, std::move(graphs));
}

std::pair<GraphMode, std::string> Trainer::plan_cuda_graph() const {
  const auto& t = parts_.training;
  auto refused = [](std::string why) { return std::make_pair(GraphMode::refused, std::move(why)); };
  if (!t.cuda_graph) return {GraphMode::not_requested, ""};
  if (!parts_.optimizer->skips_on_device())
    return refused("the optimizer is not a fused Adam/AdamW (it reads found-inf on the host)");
  if (t.non_finite == NonFinitePolicy::raise)
    return refused("non_finite \"raise\" reads found-inf on the host every update");
  if (!parts_.objective->step_graph_support().replayable)
    return refused("the objective is not replayable (StepGraphSupport::replayable)");
  if (objective_hooks_ && objective_hooks_->step_graph_support().inner_step_hooks)
    return refused("the objective needs the hooks inside the step (StepGraphSupport::inner_step_hooks)");
  for (const auto& c : parts_.callbacks)
    if (c->step_graph_support().inner_step_hooks)
      return refused("a callback needs the hooks inside the step (StepGraphSupport::inner_step_hooks)");
  if (parts_.group) return refused("data-parallel runs reduce gradients outside the captured step");
  for (const auto& m : parts_.models->models())
    if (!m.model->checkpointed_blocks().empty())
      return refused("model \"" + m.spec.name +
                     "\" recomputes activations in the backward (gradient_checkpointing), which sets the RNG state: a "
                     "captured graph cannot");
  // Last, so that a recipe tried on a CPU first reports what else would keep graphs off.
  if (!parts_.device.is_cuda() && !parts_.make_step_graph)
    return refused("CUDA graphs need a CUDA device (this run is on " + parts_.device.str() + ")");
  return {GraphMode::capture, ""};
}

std::string Trainer::cuda_graph_plan() const {
  switch (graph_mode_) {
    case GraphMode::not_requested: return "";
    case GraphMode::capture: return graph_note_.empty() ? "on" : graph_note_;
    case GraphMode::refused: return "off: " + graph_note_;
  }
  return "";
}

TrainSummary Trainer::fit() {
  const auto started = std::chrono::steady_clock::now();
  TrainSummary summary;
  begin_run(summary);
  const ModelMap models = parts_.models->model_map();
  std::unique_ptr<StepExecutor> executor = make_executor(models);
  auto& counters = state_.counters;
  const std::int64_t k = parts_.training.gradient_accumulation;
  Prefetcher batches_ahead(*parts_.train, counters.step - counters.step % k, state_.max_steps, parts_.prefetch);
  while (counters.step < state_.max_steps && !control_.stop_requested()) run_window(*executor, batches_ahead, summary);
  end_run(*executor, summary);
  summary.stopped_early = stopped_early_;
  summary.counters = counters;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return summary;
}

void Trainer::begin_run(TrainSummary& summary) {
  // EMA models (a DINO teacher) give targets: deterministic, so no dropout — eval mode. (Their
  // BatchNorm layers, if any, would use running statistics the EMA does not update.)
  for (auto& m : parts_.models->models()) m.model->train(!m.ema);
  if (!parts_.checkpoint_root.empty() || parts_.resume_from) base_fingerprint_ = base_fingerprint(*parts_.models);
  if (parts_.resume_from) {
    CheckpointState restored = load_checkpoint(*parts_.resume_from, *parts_.models, state_components(), parts_.fingerprint,
                                               parts_.training.resume_allow_changes, state_.max_steps);
    state_.counters = restored.counters;
    last_checkpoint_step_ = restored.counters.step;
    // Killed after early stopping ended it: the resumed run ends at once, as the straight one did.
    if (early_stopping_ && early_stopping_->stopped()) {
      stopped_early_ = early_stopping_->reason();
      control_.request_stop();
    }
  }
  if (!parts_.checkpoint_root.empty() && replicas_->leader()) recover_checkpoints(parts_.checkpoint_root, parts_.retention);
  replicas_->refuse_unreduced_state(*parts_.objective);
  replicas_->start();
  schedule_->start();
  emit([&](Callback& c) { c.on_train_begin(state_, control_); });
  if (parts_.training.eval_at_start && has_validation() && state_.counters.step == 0) summary.last_eval = validate();
  // The device-side skip counter exists on the device-skip path only (other paths count on the
  // host, and sync_skip_count() then reads nothing).
  if (parts_.optimizer->skips_on_device() && parts_.training.non_finite == NonFinitePolicy::skip)
    pending_skips_ = torch::zeros({}, scaler_.found_inf().options().dtype(torch::kLong));
}

void Trainer::run_window(StepExecutor& executor, Prefetcher& batches_ahead, TrainSummary& summary) {
  auto& counters = state_.counters;
  const std::int64_t k = parts_.training.gradient_accumulation;
  // Windows are aligned to multiples of k from step 0, so a run resumed inside a window
  // rebuilds that window (its batches are a function of the step) and continues it.
  const std::int64_t start = counters.step - counters.step % k;
  const std::int64_t length = std::min(k, state_.max_steps - start);
  const Window w = fetch_window(batches_ahead, start, length);
  // Data-parallel: checkpoints keep rank 0's buffers, and every window starts from them.
  if (counters.step == start) replicas_->broadcast_buffers(counters.iteration);
  executor.begin_window(w.batches);
  for (std::int64_t i = counters.step - start; i < length; ++i) {
    micro_step(executor, w, i, length);
    const bool epoch_end = counters.step % state_.steps_per_epoch == 0;
    if (epoch_end) {
      ++counters.epoch;
      emit([&](Callback& c) { c.on_epoch_end(state_, control_); });
    }
    if (after_micro_step(i + 1 == length, epoch_end, summary)) break;
  }
}

Trainer::Window Trainer::fetch_window(Prefetcher& batches_ahead, std::int64_t start, std::int64_t length) {
  Window w;
  std::int64_t samples = 0;
  for (std::int64_t i = 0; i < length; ++i) {
    // Counted on the host batch: a token count read from device labels would wait for the device.
    Batch host = batches_ahead.get(start + i);
    w.counts.push_back(parts_.objective->count(host));
    w.count += w.counts.back();
    Batch b = to_device(std::move(host), parts_.device);
    samples += b.size();
    w.batches.push_back(std::move(b));
  }
  // Data-parallel: the normaliser is the whole world's count, so that the ranks' summed
  // gradients are those of one global batch; the samples counter counts the world's.
  if (replicas_->data_parallel()) {
    auto [count, world_samples] = replicas_->global_window(w.count, samples, state_.counters.iteration);
    w.count = count;
    w.other_ranks_samples = world_samples - samples;
  }
  return w;
}

void Trainer::micro_step(StepExecutor& executor, const Window& w, std::int64_t i, std::int64_t length) {
  auto& counters = state_.counters;
  const Batch& batch = w.batches[static_cast<std::size_t>(i)];
  const bool window_end = i + 1 == length;
  if (counters.step % state_.steps_per_epoch == 0) emit([&](Callback& c) { c.on_epoch_begin(state_, control_); });
  emit([&](Callback& c) { c.on_step_begin(state_, control_); });
  parts_.objective->prepare_step(ObjectiveContext{state_, true});  // outside any capture
  micro_batch_count_ = w.counts[static_cast<std::size_t>(i)];
  StepResult result =
      executor.forward_backward(batch, w.count, window_end, length, parts_.training.gradient_accumulation, counters.step);
  // Counted before the eager update, whose hooks see this micro-batch counted.
  ++counters.step;
  counters.samples += batch.size();
  if (window_end) {
    counters.samples += w.other_ranks_samples;
    executor.update(result);
    finish_update(result);
  }
  // Counters are exact where the progress line reads them (and before evaluations,
  // checkpoints and the end); in between, device-decided skips are pending.
  if (counters.step % parts_.training.log_every == 0 || counters.step == state_.max_steps) sync_skip_count();
  result.counters = counters;
  emit([&](Callback& c) { c.on_step_end(state_, result, control_); });
}

bool Trainer::after_micro_step(bool window_end, bool epoch_end, TrainSummary& summary) {
  const auto& t = parts_.training;
  const bool checkpoints = !parts_.checkpoint_root.empty();
  evaluation_due_ |= has_validation() &&
                     (due(t.eval_every, state_.counters, true, window_end, epoch_end) || control_.evaluation_requested());
  checkpoint_due_ |= checkpoints && (due(t.checkpoint_every, state_.counters, true, window_end, epoch_end) ||
                                     control_.checkpoint_requested());
  control_.clear_requests();
  // Data-parallel: what falls due inside an accumulation window waits for its end. Until the
  // window's all-reduce each rank's gradients (and an objective's window sums) are its own, and
  // a checkpoint written by rank 0 would hold rank 0's alone (docs/distributed.md).
  if (replicas_->defer_to_window_end(window_end)) return false;
  const bool evaluate_now = evaluation_due_;
  if (evaluate_now) summary.last_eval = validate();
  checkpoint_due_ |= checkpoints && control_.checkpoint_requested();  // asked for at the evaluation
  control_.clear_requests();
  // With keep_best every evaluation leaves a checkpoint of the weights it scored (train/retention.h).
  if (checkpoint_due_ || (evaluate_now && checkpoints && checkpoint_after_evaluation(parts_.retention)))
    save_checkpoint_now();
  evaluation_due_ = checkpoint_due_ = false;
  return control_.stop_requested();
}

void Trainer::end_run(StepExecutor& executor, TrainSummary& summary) {
  const auto& counters = state_.counters;
  sync_skip_count();
  if (graph_mode_ != GraphMode::not_requested) graph_note_ = executor.report();
  if (has_validation() && (!summary.last_eval || summary.last_eval->counters.step != counters.step))
    summary.last_eval = validate();
  restore_best(summary);
  if (!parts_.checkpoint_root.empty() && (last_checkpoint_step_ != counters.step || summary.restored_best_step))
    save_checkpoint_now();
  else
    replicas_->verify(/*frozen_too=*/false, "the end of training");
  emit([&](Callback& c) { c.on_train_end(state_, control_); });
}

void Trainer::judge(const EvalResult& r) {
  if (!early_stopping_) return;
  // The evaluation at the end of the run's duration is judged (it may be the best) but stops nothing.
  const EarlyStopping::Verdict v = early_stopping_->observe(r.metrics, r.counters.step, r.counters.step < state_.max_steps);
  if (v.improved && best_weights_) best_weights_->keep(r.counters.step);
  if (v.stop) {
    stopped_early_ = v.reason;
    control_.request_stop();
  }
}

void Trainer::restore_best(TrainSummary& summary) {
  // The weights already are the best when the last evaluation was the best.
  if (!best_weights_ || best_weights_->empty() || best_weights_->step() == state_.counters.step) return;
  best_weights_->restore();
  summary.restored_best_step = best_weights_->step();
  // What the final weights score (not judged: the run is over). The final checkpoint, written at
  // this step after it, holds them: it is what `refit export` and `refit predict` take.
  // Not an evaluation of the run (no callback sees it, the log keeps the run's own).
  sync_skip_count();
  EvalResult r = evaluation_->validate(state_);
  last_eval_ = r;
  summary.last_eval = r;
}

StateComponents Trainer::state_components() {
  StateComponents c{{"optimizer", parts_.optimizer.get()},
                    {"scaler", &scaler_},
                    {"rng", &rng_},
                    {"objective", parts_.objective.get()},
                    {"schedule", schedule_.get()}};
  if (early_stopping_) c.emplace_back("early_stopping", early_stopping_.get());
  if (best_weights_) c.emplace_back("best_weights", best_weights_.get());
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
  replicas_->verify(/*frozen_too=*/false, "the checkpoint at step " + std::to_string(state_.counters.step));
  // Rank 0 writes; the others hold the same state (just verified) and carry on.
  std::filesystem::path dir = parts_.checkpoint_root / checkpoint_dir_name(state_.counters.step);
  if (replicas_->leader()) {
    dir = save_checkpoint(parts_.checkpoint_root, *parts_.models, base_fingerprint_, state_components(), cs);
    apply_retention(parts_.checkpoint_root, parts_.retention);
  }
  last_checkpoint_step_ = state_.counters.step;
  emit([&](Callback& c) { c.on_checkpoint_saved(state_, dir.string(), control_); });
}

EvalResult Trainer::evaluate(const DataLoader& loader, const std::string& split) {
  sync_skip_count();
  emit([&](Callback& c) { c.on_evaluation_begin(state_, control_); });
  EvalResult r = evaluation_->evaluate(loader, split, state_);
  if (split == "val") last_eval_ = r;
  emit([&](Callback& c) { c.on_evaluation_end(state_, r, control_); });
  return r;
}

EvalResult Trainer::validate() {
  sync_skip_count();
  emit([&](Callback& c) { c.on_evaluation_begin(state_, control_); });
  EvalResult r = evaluation_->validate(state_);
  last_eval_ = r;  // checkpoints written at this step are ranked by it
  emit([&](Callback& c) { c.on_evaluation_end(state_, r, control_); });
  judge(r);
  return r;
}

}  // namespace refit
