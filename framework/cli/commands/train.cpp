#include "cli/commands/train.h"

#include <chrono>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "callbacks/compute_meter.h"
#include "callbacks/ema.h"
#include "callbacks/memory_meter.h"
#include "callbacks/metrics_log.h"
#include "callbacks/plot.h"
#include "callbacks/progress.h"
#include "callbacks/tensorboard.h"
#include "distributed/world.h"
#include "io/remove_tree.h"
#include "memory/host_allocator.h"
#include "memory/process_malloc.h"
#include "memory/process_memory.h"
#include "precision/bf16_products.h"
#include "refit/version.h"
#include "run/run_environment.h"
#include "run/run_report.h"
#include "train/optimizer.h"

namespace refit::cli {

namespace {

/// Takes, on ranks > 0 of a data-parallel run, the place of a callback rank 0 alone runs (the
/// progress line, the metrics log): nothing to do, no state. Every rank then names its callbacks
/// alike ("callback/<i>") in checkpoints.
class RankZeroOnlyStandIn : public Callback {};

/// One `refit train`, in the order it happens: join the ranks, describe the run, build the
/// trainer's parts, fit, write the run folder.
class TrainRun {
 public:
  TrainRun(const Assembly& assembly, std::FILE* out)
      : a_(assembly), t_(assembly.recipe().training), out_(out), device_(assembly.device()), mode_(assembly.precision()) {}

  TrainSummary run(std::vector<CallbackPtr> extra) {
    join_world();
    print_header();
    const auto build_start = std::chrono::steady_clock::now();
    models_ = a_.build_models();
    std::fprintf(out_, "models: built and loaded in %.1f s, process peak RSS %s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count(),
                 bytes_string(static_cast<double>(peak_rss_bytes())).c_str());
    print_model_descriptions();
    Trainer trainer(trainer_parts(std::move(extra)));
    const std::string planned = trainer.cuda_graph_plan();
    if (!planned.empty()) std::fprintf(out_, "cuda graph: %s\n", planned.c_str());
    TrainSummary summary = trainer.fit();
    if (!summary.stopped_early.empty()) std::fprintf(out_, "%s\n", summary.stopped_early.c_str());
    if (summary.restored_best_step)
      std::fprintf(out_, "restore_best: the final weights (checkpoint, export) are those of step %lld\n",
                   static_cast<long long>(*summary.restored_best_step));
    if (trainer.cuda_graph_plan() != planned)  // what happened: captures and replays, or a failed capture
      std::fprintf(out_, "cuda graph: %s\n", trainer.cuda_graph_plan().c_str());
    nlohmann::json s = summary_json(trainer, summary);
    add_memory(s);
    add_compute(s);
    if (leader()) write_run_folder(s);
    return summary;
  }

 private:
  bool leader() const { return !group_ || group_->rank() == 0; }
  int rank() const { return group_ ? group_->rank() : 0; }
  int world_size() const { return group_ ? group_->size() : 1; }

  // Data-parallel (launched by torchrun): join the process group before anything slow, so that a
  // rendezvous problem shows at once. Rank 0 alone reports and writes (docs/distributed.md).
  void join_world() {
    auto world = world_from_environment();
    if (!world) return;
    group_ = std::make_shared<ProcessGroup>(*world, t_.distributed, device_);
    if (group_->rank() != 0) {
      quiet_.reset(std::fopen("/dev/null", "w"));
      if (quiet_) out_ = quiet_.get();
    }
  }

  void print_header() const {
    const Recipe& r = a_.recipe();
    std::fprintf(out_, "refit %s | recipe %s | device %s | precision %s\n", kVersion,
                 r.file.empty() ? r.name.c_str() : r.file.c_str(), device_.str().c_str(), to_string(mode_));
    if (device_.is_cpu())
      std::fprintf(out_, "CPU bf16 products: %s\n", precision::configure_bf16_products().describe().c_str());
    if (group_)
      std::fprintf(out_,
                   "data-parallel: %d processes, %s; global batch %lld (%lld per rank x %d ranks x %lld accumulation)\n",
                   world_size(), group_->describe().c_str(),
                   static_cast<long long>(t_.batch_size * world_size() * t_.gradient_accumulation),
                   static_cast<long long>(t_.batch_size), world_size(), static_cast<long long>(t_.gradient_accumulation));
  }

  // What a model says about its configuration (Model::describe(): the bert model's pooling and
  // the file that declared it); an EMA model repeats its source's, so it says nothing.
  void print_model_descriptions() const {
    for (const auto& m : models_->models()) {
      if (m.ema) continue;
      const std::string d = m.model->describe();
      if (!d.empty()) std::fprintf(out_, "model %s: %s\n", m.spec.name.c_str(), d.c_str());
    }
  }

  // Evaluation data: each rank scores its own block; every sample once over the world.
  std::shared_ptr<DataLoader> eval_loader(DatasetPtr set, const char* pointer) const {
    if (set->size() < world_size())
      throw Error(std::string(pointer) + ": " + std::to_string(set->size()) + " samples, fewer than the " +
                  std::to_string(world_size()) + " ranks that evaluate a block of it each");
    return std::make_shared<DataLoader>(set, LoaderOptions{t_.batch_size, false, false, 0, rank(), world_size(),
                                                           Sharding::contiguous});
  }

  TrainerParts trainer_parts(std::vector<CallbackPtr> extra) {
    TrainerParts parts;
    parts.models = models_.get();
    parts.group = group_;
    parts.training = t_;
    parts.scheduler = a_.recipe().scheduler;
    parts.precision = mode_;
    parts.device = device_;
    parts.prefetch = PrefetchOptions{t_.num_workers, t_.prefetch, device_.is_cuda()};
    add_data(parts);
    parts.objective = a_.objective();
    parts.evaluators = a_.evaluators();
    check_fields(parts);
    add_optimizer(parts);
    add_checkpoints(parts);
    add_callbacks(parts, std::move(extra));
    return parts;
  }

  void add_data(TrainerParts& parts) {
    train_set_ = a_.train_data();
    parts.train = std::make_shared<DataLoader>(train_set_, LoaderOptions{t_.batch_size, t_.shuffle, t_.drop_last, t_.seed,
                                                                         rank(), world_size(), Sharding::global_batches});
    std::fprintf(out_, "train data: %s\n", train_set_->describe().c_str());
    if (auto val = a_.val_data()) {
      parts.val = eval_loader(val, "/data/val");
      std::fprintf(out_, "val data:   %s\n", val->describe().c_str());
    }
    for (auto& [name, set] : a_.data_sets()) {
      auto data = std::make_shared<LoaderEvalData>(set, t_.batch_size, device_);
      std::fprintf(out_, "data set %-10s %s\n", name.c_str(), set->describe().c_str());
      parts.eval_sets[name] = data;
    }
  }

  void check_fields(const TrainerParts& parts) const {
    std::map<std::string, const Dataset*> sets;
    for (const auto& [name, set] : parts.eval_sets) sets[name] = &static_cast<const LoaderEvalData&>(*set).dataset();
    a_.check_fields(models_->model_map(),
                    {{"/data/train", train_set_.get()}, {"/data/val", parts.val ? &parts.val->dataset() : nullptr}}, sets,
                    *parts.objective, parts.evaluators);
  }

  void add_optimizer(TrainerParts& parts) {
    const Recipe& r = a_.recipe();
    parts.optimizer = make_optimizer(r.optimizer, models_->parameter_groups(r.optimizer, weight_decay_exemptions(r)));
    for (std::size_t i = 0; i < parts.optimizer->group_count(); ++i) {
      const ParameterGroup& g = parts.optimizer->group(i);
      group_names_.push_back(g.name);
    }
    parts.fingerprint = resume_fingerprint(r, mode_);
    // The ranks' shards, hence every window's batches, depend on the world size.
    parts.fingerprint["/training/world_size"] = std::to_string(world_size());
  }

  void add_checkpoints(TrainerParts& parts) {
    const Recipe& r = a_.recipe();
    if (leader()) io::remove_stale_entries(r.output_dir);  // temporary files of a killed run (training.svg's)
    if (r.checkpoints.enabled) {
      parts.checkpoint_root = r.output_dir / "checkpoints";
      parts.retention =
          RetentionPolicy{r.checkpoints.keep_last, r.checkpoints.keep_best, r.checkpoints.metric, r.checkpoints.maximize};
    }
    if (t_.resume == "latest") {
      parts.resume_from = latest_checkpoint(r.output_dir / "checkpoints");
      std::fprintf(out_, parts.resume_from ? "resuming from %s\n" : "resume: no checkpoint in %s yet, starting fresh\n",
                   (parts.resume_from ? *parts.resume_from : r.output_dir / "checkpoints").c_str());
    } else if (!t_.resume.empty()) {
      parts.resume_from = std::filesystem::path(t_.resume);
      std::fprintf(out_, "resuming from %s\n", t_.resume.c_str());
    }
  }

  // The order is the hook order: EMA models first (every later callback and the next step see the
  // updated copies), the progress line, the metrics log (with the TensorBoard event file as its
  // listener), the recipe's, then `extra`.
  void add_callbacks(TrainerParts& parts, std::vector<CallbackPtr> extra) {
    auto ema = std::make_shared<EmaCallback>(*models_);
    if (!ema->empty()) parts.callbacks.push_back(ema);
    auto rank_zero_only = [&](auto make) -> CallbackPtr {
      if (leader()) return make();
      return std::make_shared<RankZeroOnlyStandIn>();
    };
    parts.callbacks.push_back(rank_zero_only([&] { return std::make_shared<ProgressCallback>(t_.log_every, out_); }));
    compute_ = std::make_shared<ComputeMeterCallback>(t_.gradient_accumulation, device_peak());
    parts.callbacks.push_back(rank_zero_only([&] {
      auto log = std::make_shared<MetricsLogCallback>(a_.recipe().output_dir / "metrics.jsonl",
                                                      /*append=*/parts.resume_from.has_value(), t_.log_every);
      if (a_.recipe().tensorboard) {
        auto events = tensorboard_writer(parts.resume_from.has_value());
        if (compute_->peak()) events->set_peak_flops(compute_->peak()->flops_per_second);
        log->set_listener(std::move(events));
      }
      log->set_flops_per_update([meter = compute_.get()] { return meter->flops_per_update(); });
      return log;
    }));
    for (auto& c : a_.callbacks()) parts.callbacks.push_back(std::move(c));
    for (auto& c : extra) parts.callbacks.push_back(std::move(c));
    // Last, so that the callbacks before it keep their checkpoint names ("callback/<i>").
    const auto& out = a_.recipe();
    meter_ =
        std::make_shared<MemoryMeterCallback>(*models_, *parts.optimizer, device_,
                                              out.memory_log && leader()
                                                  ? std::optional<std::filesystem::path>(out.output_dir / "memory.jsonl")
                                                  : std::nullopt);
    parts.callbacks.push_back(meter_);
    parts.callbacks.push_back(compute_);  // stateless: adds no checkpoint entry
    print_memory_estimate();
    if (const auto& peak = compute_->peak())
      std::fprintf(out_, "compute peak: %.4g GFLOP/s (%s); FLOPs counted on the first update, MFU at the end\n",
                   peak->flops_per_second / 1e9, peak->basis.c_str());
    else
      std::fprintf(out_, "compute peak: unknown for this device; FLOPs counted on the first update\n");
    for (std::size_t i = 0; i < parts.optimizer->group_count(); ++i) {
      const ParameterGroup& g = parts.optimizer->group(i);
      std::fprintf(out_, "param group %-12s %6zu tensors  lr %.2e  weight_decay %.2e\n", g.name.c_str(), g.parameters.size(),
                   g.lr, g.weight_decay);
    }
  }

  // The event file follows the metrics log's lines; the recipe's text is the recipe.json the
  // command wrote into the run folder (absent when a caller trains an in-memory recipe).
  std::shared_ptr<TensorBoardWriter> tensorboard_writer(bool resuming) const {
    const auto& dir = a_.recipe().output_dir;
    std::string recipe_json;
    if (std::ifstream in{dir / "recipe.json"}) recipe_json.assign(std::istreambuf_iterator<char>(in), {});
    return std::make_shared<TensorBoardWriter>(dir, group_names_, std::move(recipe_json), resuming);
  }

  // Memory by component: estimated when the run starts, measured by the run (memory/memory_report.h).
  void print_memory_estimate() {
    estimate_ = estimate_memory(*models_, a_.recipe().optimizer);
    std::fprintf(out_, "memory estimate: frozen weights %s, trainable weights %s, gradients %s, optimizer state %s\n",
                 bytes_string(static_cast<double>(estimate_.frozen_weights)).c_str(),
                 bytes_string(static_cast<double>(estimate_.trainable_weights)).c_str(),
                 bytes_string(static_cast<double>(estimate_.gradients)).c_str(),
                 bytes_string(static_cast<double>(estimate_.optimizer_state)).c_str());
  }

  // The peak of the arithmetic the products run in: bf16 on native kernels, else fp32 (the
  // fp32 route of CPU bf16 products included).
  std::optional<perf::PeakFlops> device_peak() const {
    const bool half = mode_ != Precision::fp32;
    if (device_.is_cuda()) return perf::gpu_peak(device_model(device_), half);
    if (!device_.is_cpu()) return std::nullopt;
    const bool bf16 = mode_ == Precision::bf16_mixed || mode_ == Precision::bf16_true;
    // Chosen per shape, some products run on the native bf16 kernels: the peak is theirs.
    const auto& products = precision::configure_bf16_products();
    return perf::cpu_peak(perf::describe_this_cpu(), bf16 && (products.native || products.per_shape));
  }

  void add_compute(nlohmann::json& s) const {
    add_bf16_shapes(s);
    if (!compute_) return;
    std::fprintf(out_, "%s\n", compute_->describe().c_str());
    s["compute"] = compute_->to_json();
  }

  // The per-shape choices of CPU bf16 products (precision/shape_routing.h), when they were made
  // by measurement: a line here, the table in summary.json.
  void add_bf16_shapes(nlohmann::json& s) const {
    const auto decisions = precision::bf16_shape_decisions();
    if (decisions.empty()) return;
    std::size_t fp32 = 0;
    nlohmann::json table = nlohmann::json::array();
    for (const auto& d : decisions) {
      fp32 += d.fp32 ? 1 : 0;
      table.push_back({{"shape", d.shape_class},
                       {"route", d.fp32 ? "fp32" : "native"},
                       {"native_seconds", d.native_seconds},
                       {"fp32_seconds", d.fp32_seconds},
                       {"native_given_up", d.native_given_up},
                       {"timed_before", d.from_store},
                       {"calls", d.calls}});
    }
    std::size_t stored = 0;
    for (const auto& d : decisions) stored += d.from_store ? 1 : 0;
    std::fprintf(out_,
                 "CPU bf16 products by shape: %zu shape classes, %zu through fp32, %zu native; %zu timed here, %zu as "
                 "timed before on this machine (summary.json: bf16_product_shapes)\n",
                 decisions.size(), fp32, decisions.size() - fp32, decisions.size() - stored, stored);
    s["bf16_product_shapes"] = std::move(table);
  }

  void add_memory(nlohmann::json& s) const {
    if (!meter_) return;
    const MemoryBreakdown measured = meter_->measured();
    std::fprintf(out_, "%s", memory_table(estimate_, &measured).c_str());
    std::fprintf(out_, "  activations: %s\n", measured.activations_note.c_str());
    const std::int64_t peak = peak_rss_bytes();
    std::fprintf(out_, "process peak RSS: %s\n", bytes_string(static_cast<double>(peak)).c_str());
    s["memory"] = {{"estimated", estimate_.to_json()}, {"measured", measured.to_json()}, {"peak_rss_bytes", peak}};
  }

  nlohmann::json summary_json(Trainer& trainer, const TrainSummary& summary) {
    nlohmann::json s;
    s["steps"] = summary.counters.step;
    s["iterations"] = summary.counters.iteration;
    s["skipped_iterations"] = summary.counters.skipped_iterations;
    s["seconds"] = summary.seconds;
    if (!trainer.cuda_graph_plan().empty()) s["cuda_graph"] = trainer.cuda_graph_plan();
    s["malloc"] = process_malloc();
    s["environment"] =
        run_environment(device_, to_string(mode_), uses_grad_scaler(mode_) && t_.grad_scaler.enabled, group_names_);
    add_host_allocator(s);
    if (summary.last_eval) s["val"] = summary.last_eval->metrics;
    if (!summary.stopped_early.empty()) s["stopped_early"] = summary.stopped_early;
    if (summary.restored_best_step) s["restored_best_step"] = *summary.restored_best_step;
    if (auto test = a_.test_data()) s["test"] = trainer.evaluate(*eval_loader(test, "/data/test"), "test").metrics;
    if (group_) s["world_size"] = world_size();
    return s;
  }

  void add_host_allocator(nlohmann::json& s) const {
    if (!caching_host_allocator_installed()) {
      std::fprintf(out_, "host allocator: LibTorch's (no cache; malloc: %s)\n", process_malloc().c_str());
      return;
    }
    const HostAllocatorStats h = host_allocator_stats();
    std::fprintf(out_, "host allocator: %llu CPU allocations, %.1f %% reused from the cache (%.1f MiB cached; malloc: %s)\n",
                 static_cast<unsigned long long>(h.allocations),
                 h.allocations ? 100.0 * static_cast<double>(h.cache_hits) / static_cast<double>(h.allocations) : 0.0,
                 static_cast<double>(h.cached_bytes) / (1 << 20), process_malloc().c_str());
    s["host_allocator"] = {{"allocations", h.allocations}, {"cache_hits", h.cache_hits}, {"cached_bytes", h.cached_bytes}};
  }

  void write_run_folder(const nlohmann::json& s) const {
    const auto& dir = a_.recipe().output_dir;
    std::ofstream(dir / "summary.json") << s.dump(2) << "\n";
    write_training_plot(dir / "metrics.jsonl", dir / "training.svg");
    write_run_report(dir);
    std::fprintf(out_,
                 "run directory: %s (report.html, metrics.jsonl, metrics.csv, training.svg, summary.json, checkpoints/)\n",
                 dir.c_str());
  }

  const Assembly& a_;
  const TrainingSpec& t_;
  std::FILE* out_;
  const torch::Device device_;
  const Precision mode_;
  std::shared_ptr<ProcessGroup> group_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> quiet_{nullptr, &std::fclose};
  std::unique_ptr<ModelRegistry> models_;
  DatasetPtr train_set_;
  std::vector<std::string> group_names_;
  std::shared_ptr<MemoryMeterCallback> meter_;
  std::shared_ptr<ComputeMeterCallback> compute_;
  MemoryBreakdown estimate_;
};

}  // namespace

TrainSummary train(const Assembly& assembly, std::FILE* out, std::vector<CallbackPtr> extra) {
  return TrainRun(assembly, out).run(std::move(extra));
}

}  // namespace refit::cli
