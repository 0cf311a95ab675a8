#include "run/session.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include <torch/cuda.h>
#include <torch/utils.h>

#include "callbacks/ema.h"
#include "callbacks/metrics_log.h"
#include "callbacks/plot.h"
#include "callbacks/progress.h"
#include "distributed/process_group.h"
#include "distributed/world.h"
#include "data/loader.h"
#include "evaluators/evaluators.h"
#include "io/adapter_files.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "memory/host_allocator.h"
#include "memory/process_malloc.h"
#include "model/weights.h"
#include "objectives/classification.h"
#include "precision/bf16_products.h"
#include "refit/version.h"
#include "run/run_environment.h"
#include "run/run_report.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace refit {

namespace {

/// Takes, on ranks > 0 of a data-parallel run, the place of a callback rank 0 alone runs (the
/// progress line, the metrics log): nothing to do, no state.
class RankZeroOnlyStandIn : public Callback {};

}  // namespace

void register_builtins(Registry& registry) {
  Provenance saved = registry.current_provenance();
  registry.set_current_provenance(Provenance{"refit (built-in)", nullptr});
  register_classification_objective(registry);
  register_builtin_evaluators(registry);
  registry.set_current_provenance(saved);
}

Session::Session(Recipe recipe) : recipe_(std::move(recipe)) {
  ConfigIssues& issues = *recipe_.issues;
  register_builtins(registry_);
  for (std::size_t i = 0; i < recipe_.plugins.size(); ++i) {
    try {
      loader_.load(recipe_.plugins[i], recipe_.plugin_paths, recipe_.base_dir);
    } catch (const std::exception& e) {
      issues.add("/plugins/load/" + std::to_string(i), e.what());
    }
  }
  auto parse = [](const auto& table, const ComponentSpec& c) {
    return table.parse(c.type, c.type_pointer, *c.config);
  };
  for (std::size_t i = 0; i < recipe_.models.size(); ++i) {
    const ModelEntry& m = recipe_.models[i];
    ModelBuild b;
    if (m.ema) {
      // An EMA model is built by its source's builders: find the source among earlier entries.
      std::vector<std::string> earlier;
      for (std::size_t j = 0; j < i; ++j) {
        if (recipe_.models[j].spec.name == m.ema->of) b.source = static_cast<int>(j);
        earlier.push_back(recipe_.models[j].spec.name);
      }
      if (b.source < 0)
        issues.add(m.pointer + "/ema/of", "no model named \"" + m.ema->of + "\" is declared before this one in /models" +
                                              did_you_mean(m.ema->of, earlier));
      else if (recipe_.models[b.source].ema)
        issues.add(m.pointer + "/ema/of", "\"" + m.ema->of + "\" is itself an EMA model; point at the trained model");
      model_builders_.push_back(std::move(b));
      continue;
    }
    if (!m.component.type.empty()) b.model = parse(registry_.models, m.component);
    for (const auto& a : m.adapters) {
      if (!a.type.empty()) b.adapters.push_back(parse(registry_.adapters, a));
      // Several adapters of one type on a model are told apart by their "name" (lora's), in
      // inspect's rows and export's folders: "lora-<name>".
      std::string label = a.type;
      if (a.config && a.config->raw().is_object() && a.config->raw().contains("name") && a.config->raw()["name"].is_string())
        label += "-" + a.config->raw()["name"].get<std::string>();
      b.adapter_names.push_back(label);
    }
    model_builders_.push_back(std::move(b));
  }
  if (!recipe_.train_data.type.empty()) train_data_ = parse(registry_.datasets, recipe_.train_data);
  if (recipe_.val_data && !recipe_.val_data->type.empty()) val_data_ = parse(registry_.datasets, *recipe_.val_data);
  if (recipe_.test_data && !recipe_.test_data->type.empty()) test_data_ = parse(registry_.datasets, *recipe_.test_data);
  if (!recipe_.objective.type.empty()) objective_ = parse(registry_.objectives, recipe_.objective);
  for (const auto& c : recipe_.callbacks)
    if (!c.type.empty()) callbacks_.push_back(parse(registry_.callbacks, c));
  for (const auto& [name, c] : recipe_.data_sets)
    if (!c.type.empty()) data_sets_.emplace_back(name, parse(registry_.datasets, c));
  for (const auto& c : recipe_.evaluators)
    if (!c.type.empty()) evaluators_.push_back(parse(registry_.evaluators, c));

  // Cross-references: the models and data sets that the objective and evaluators read must be
  // declared. A missing name is reported at the config value that holds it when there is one
  // ("/objective/config/teacher/1"), else at "<config>/<kind>/<index in the required list>".
  auto where_named = [](const ConfigReader& config, const std::string& name, const std::string& fallback) {
    if (!config.is_object()) return fallback;
    for (const auto& [key, value] : config.raw().items()) {
      if (value.is_string() && value.get<std::string>() == name) return config.pointer_to(key);
      if (value.is_array())
        for (std::size_t k = 0; k < value.size(); ++k)
          if (value[k].is_string() && value[k].get<std::string>() == name)
            return config.pointer_to(key) + "/" + std::to_string(k);
    }
    return fallback;
  };
  std::set<std::string> declared;
  for (const auto& m : recipe_.models) declared.insert(m.spec.name);
  std::vector<std::string> names(declared.begin(), declared.end());
  auto check_models = [&](const std::vector<std::string>& required, const ConfigReader& config) {
    for (std::size_t j = 0; j < required.size(); ++j)
      if (!declared.count(required[j]))
        issues.add(where_named(config, required[j], config.pointer() + "/models/" + std::to_string(j)),
                   "no model named \"" + required[j] + "\" in /models" + did_you_mean(required[j], names));
  };
  std::map<std::string, std::string> metric_owner;  // metric -> who reports it
  if (objective_) {
    auto objective = objective_(BuildContext{});
    check_models(objective->required_models(), *recipe_.objective.config);
    // With val data the objective's loss and metrics are part of every evaluation.
    if (val_data_) {
      metric_owner["loss"] = "the objective";
      for (const auto& m : objective->metric_names()) metric_owner[m] = "the objective";
    }
  }
  std::vector<std::string> set_names;
  for (const auto& d : recipe_.data_sets) set_names.push_back(d.first);
  for (std::size_t i = 0, b = 0; i < recipe_.evaluators.size(); ++i) {
    const ComponentSpec& spec = recipe_.evaluators[i];
    if (spec.type.empty()) continue;
    const Builder<Evaluator>& build = evaluators_[b++];
    if (!build) continue;
    auto evaluator = build(BuildContext{});
    check_models(evaluator->required_models(), *spec.config);
    for (const auto& metric : evaluator->metric_names()) {
      auto [it, fresh] = metric_owner.emplace(metric, "/evaluators/" + std::to_string(i));
      if (!fresh)
        issues.add(spec.config->pointer_to("metric"), "metric \"" + metric + "\" is already reported by " + it->second +
                                                          "; give this evaluator another \"metric\" name");
    }
    auto data = evaluator->required_data();
    for (std::size_t j = 0; j < data.size(); ++j)
      if (std::find(set_names.begin(), set_names.end(), data[j]) == set_names.end())
        issues.add(where_named(*spec.config, data[j], spec.config->pointer() + "/data/" + std::to_string(j)),
                   "no data set named \"" + data[j] + "\" in /data/sets" + did_you_mean(data[j], set_names));
  }
  // Checkpoints ranked by a metric no evaluation reports would all rank alike (keep_best keeping
  // nothing useful); keep_best ranks the checkpoints written after evaluations (each by the
  // evaluation of its own weights), so without /training/eval_every only the final one.
  const CheckpointSpec& ck = recipe_.checkpoints;
  if (ck.enabled && (ck.keep_best > 0 || ck.metric != "loss") && !metric_owner.count(ck.metric)) {
    std::vector<std::string> reported;
    std::string list;
    for (const auto& [m, who] : metric_owner) reported.push_back(m), list += (list.empty() ? "" : ", ") + m;
    issues.add("/output/checkpoints/metric",
               "no evaluation reports the metric \"" + ck.metric + "\" (reported: " +
                   (list.empty() ? std::string("none: add /data/val or /evaluators") : list) + ")" +
                   did_you_mean(ck.metric, reported));
  }
  if (ck.enabled && ck.keep_best > 0 && !recipe_.training.eval_every)
    issues.add("/output/checkpoints/keep_best",
               "keep_best ranks checkpoints by an evaluation of their own weights (a checkpoint is written after each "
               "evaluation), but /training/eval_every is not set (only the final checkpoint would be evaluated)");
  issues.throw_if_any();
}

torch::Device Session::device() const {
  torch::Device d = resolve_device(recipe_.training.device);
  // One process per device: under torchrun, LOCAL_RANK picks the CUDA device of this rank.
  if (d.is_cuda() && !d.has_index())
    if (auto world = world_from_environment()) return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world->local_rank));
  return d;
}

Precision Session::precision() const {
  if (recipe_.training.precision) return *recipe_.training.precision;
  // "auto": bf16-mixed where the device computes bf16 fast (CUDA), fp32 on CPUs (most lack
  // fast bf16 matmul, and fp32 is the safe reference there). See docs/precision.md.
  return device().is_cuda() ? Precision::bf16_mixed : Precision::fp32;
}

std::unique_ptr<ModelRegistry> Session::build_models() const {
  torch::Device run_device = device();
  auto registry = std::make_unique<ModelRegistry>(precision());
  torch::manual_seed(recipe_.training.seed);
  BuildContext ctx{run_device, recipe_.training.seed, recipe_.output_dir};
  for (std::size_t i = 0; i < recipe_.models.size(); ++i) {
    const ModelEntry& declared = recipe_.models[i];
    const ModelBuild& own_build = model_builders_[i];
    // An EMA model is built exactly like its source; then registration mirrors the source.
    const ModelEntry& entry = own_build.source >= 0 ? recipe_.models[own_build.source] : declared;
    const ModelBuild& build = own_build.source >= 0 ? model_builders_[own_build.source] : own_build;
    torch::Device model_device = declared.spec.device == "auto" ? run_device : resolve_device(declared.spec.device);
    ModelPtr model = build.model(ctx);
    model->set_input_mapping(entry.inputs);
    if (entry.weights) {
      try {
        load_weights(*model, *entry.weights, entry.spec.name);
      } catch (const Error& e) {
        throw Error(entry.pointer + "/weights: " + e.what());
      }
    }
    ModelSpec spec = entry.spec;
    std::vector<std::string> owners(spec.rules.size(), "");
    std::vector<std::pair<std::string, AdapterPtr>> adapters;
    for (std::size_t a = 0; a < build.adapters.size(); ++a) {
      const std::string where = entry.pointer + "/adapters/" + std::to_string(a);
      AdapterPtr adapter = build.adapters[a](ctx);
      try {
        adapter->attach(*model);
        if (entry.adapter_loads[a]) adapter->import_files(*model, io::read_adapter_files(*entry.adapter_loads[a]));
      } catch (const std::exception& e) {
        throw Error(where + ": " + e.what());
      }
      for (auto& rule : adapter->parameter_rules()) {
        spec.rules.push_back(rule);
        owners.push_back(build.adapter_names[a]);
      }
      adapters.emplace_back(build.adapter_names[a], adapter);
    }
    try {
      if (declared.ema) registry->add_ema(model, declared.spec, *declared.ema, model_device, std::move(adapters));
      else registry->add(model, spec, model_device, owners, std::move(adapters));
    } catch (const Error& e) {
      throw Error(declared.pointer + ": " + e.what());
    }
  }
  registry->validate_complete();
  return registry;
}

TrainSummary Session::train(std::FILE* out, std::vector<CallbackPtr> extra) const {
  torch::Device run_device = device();
  Precision mode = precision();
  const TrainingSpec& t = recipe_.training;
  // Data-parallel (launched by torchrun): join the process group before anything slow, so that a
  // rendezvous problem shows at once. Rank 0 alone reports and writes (docs/distributed.md).
  std::shared_ptr<ProcessGroup> group;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> quiet(nullptr, &std::fclose);
  if (auto world = world_from_environment()) {
    group = std::make_shared<ProcessGroup>(*world, t.distributed, run_device);
    if (group->rank() != 0) {
      quiet.reset(std::fopen("/dev/null", "w"));
      if (quiet) out = quiet.get();
    }
  }
  const bool leader = !group || group->rank() == 0;
  const int rank = group ? group->rank() : 0, world_size = group ? group->size() : 1;
  std::fprintf(out, "refit %s | recipe %s | device %s | precision %s\n", kVersion,
               recipe_.file.empty() ? recipe_.name.c_str() : recipe_.file.c_str(), run_device.str().c_str(),
               to_string(mode));
  if (run_device.is_cpu()) std::fprintf(out, "CPU bf16 products: %s\n", precision::configure_bf16_products().describe().c_str());
  if (group)
    std::fprintf(out, "data-parallel: %d processes, %s; global batch %lld (%lld per rank x %d ranks x %lld accumulation)\n",
                 world_size, group->describe().c_str(),
                 static_cast<long long>(t.batch_size * world_size * t.gradient_accumulation),
                 static_cast<long long>(t.batch_size), world_size, static_cast<long long>(t.gradient_accumulation));
  auto models = build_models();
  BuildContext ctx{run_device, recipe_.training.seed, recipe_.output_dir};

  TrainerParts parts;
  parts.models = models.get();
  parts.group = group;
  auto train_set = train_data_(ctx);
  parts.train = std::make_shared<DataLoader>(
      train_set, LoaderOptions{t.batch_size, t.shuffle, t.drop_last, t.seed, rank, world_size, Sharding::global_batches});
  std::fprintf(out, "train data: %s\n", train_set->describe().c_str());
  // Evaluation data: each rank scores its own block; every sample once over the world.
  auto eval_loader = [&](DatasetPtr set, const char* pointer) {
    if (set->size() < world_size)
      throw Error(std::string(pointer) + ": " + std::to_string(set->size()) + " samples, fewer than the " +
                  std::to_string(world_size) + " ranks that evaluate a block of it each");
    return std::make_shared<DataLoader>(set, LoaderOptions{t.batch_size, false, false, 0, rank, world_size, Sharding::contiguous});
  };
  if (val_data_) {
    auto val_set = val_data_(ctx);
    parts.val = eval_loader(val_set, "/data/val");
    std::fprintf(out, "val data:   %s\n", val_set->describe().c_str());
  }
  parts.objective = objective_(ctx);
  parts.optimizer =
      make_optimizer(recipe_.optimizer, models->parameter_groups(recipe_.optimizer, weight_decay_exemptions(recipe_)));
  parts.training = t;
  parts.scheduler = recipe_.scheduler;
  parts.precision = mode;
  parts.fingerprint = resume_fingerprint(recipe_, mode);
  // The ranks' shards, hence every window's batches, depend on the world size.
  parts.fingerprint["/training/world_size"] = std::to_string(world_size);
  parts.device = run_device;
  parts.prefetch = PrefetchOptions{t.num_workers, t.prefetch, run_device.is_cuda()};
  // EMA models first: every later callback and the next step see the updated copies.
  auto ema = std::make_shared<EmaCallback>(*models);
  if (!ema->empty()) parts.callbacks.push_back(ema);
  // On ranks > 0 a stand-in takes the place of each callback rank 0 alone runs, so that every
  // rank names its callbacks alike ("callback/<i>") in checkpoints.
  auto rank_zero_only = [&](auto make) -> CallbackPtr {
    if (leader) return make();
    return std::make_shared<RankZeroOnlyStandIn>();
  };
  parts.callbacks.push_back(rank_zero_only([&] { return std::make_shared<ProgressCallback>(t.log_every, out); }));
  for (const auto& [name, builder] : data_sets_) {
    auto set = std::make_shared<LoaderEvalData>(builder(ctx), t.batch_size, run_device);
    std::fprintf(out, "data set %-10s %s\n", name.c_str(), set->dataset().describe().c_str());
    parts.eval_sets[name] = set;
  }
  for (const auto& e : evaluators_) parts.evaluators.push_back(e(ctx));
  {
    std::map<std::string, const Dataset*> sets;
    for (const auto& [name, set] : parts.eval_sets)
      sets[name] = &static_cast<const LoaderEvalData&>(*set).dataset();
    check_fields(models->model_map(), *train_set, parts.val ? &parts.val->dataset() : nullptr, sets, *parts.objective,
                 parts.evaluators);
  }
  if (leader) io::remove_stale_entries(recipe_.output_dir);  // temporary files of a killed run (training.svg's)
  if (recipe_.checkpoints.enabled) {
    parts.checkpoint_root = recipe_.output_dir / "checkpoints";
    parts.retention = RetentionPolicy{recipe_.checkpoints.keep_last, recipe_.checkpoints.keep_best,
                                      recipe_.checkpoints.metric, recipe_.checkpoints.maximize};
  }
  if (t.resume == "latest") {
    parts.resume_from = latest_checkpoint(recipe_.output_dir / "checkpoints");
    std::fprintf(out, parts.resume_from ? "resuming from %s\n" : "resume: no checkpoint in %s yet, starting fresh\n",
                 (parts.resume_from ? *parts.resume_from : recipe_.output_dir / "checkpoints").c_str());
  } else if (!t.resume.empty()) {
    parts.resume_from = std::filesystem::path(t.resume);
    std::fprintf(out, "resuming from %s\n", t.resume.c_str());
  }
  parts.callbacks.push_back(rank_zero_only([&] {
    return std::make_shared<MetricsLogCallback>(recipe_.output_dir / "metrics.jsonl",
                                                /*append=*/parts.resume_from.has_value(), t.log_every);
  }));
  for (const auto& c : callbacks_) parts.callbacks.push_back(c(ctx));
  for (auto& c : extra) parts.callbacks.push_back(std::move(c));
  std::vector<std::string> group_names;
  for (std::size_t i = 0; i < parts.optimizer->group_count(); ++i) {
    const ParameterGroup& g = parts.optimizer->group(i);
    group_names.push_back(g.name);
    std::fprintf(out, "param group %-12s %6zu tensors  lr %.2e  weight_decay %.2e\n", g.name.c_str(),
                 g.parameters.size(), g.lr, g.weight_decay);
  }

  Trainer trainer(std::move(parts));
  const std::string planned = trainer.cuda_graph_plan();
  if (!planned.empty()) std::fprintf(out, "cuda graph: %s\n", planned.c_str());
  TrainSummary summary = trainer.fit();
  if (trainer.cuda_graph_plan() != planned)  // what happened: captures and replays, or a failed capture
    std::fprintf(out, "cuda graph: %s\n", trainer.cuda_graph_plan().c_str());
  nlohmann::json s;
  s["steps"] = summary.counters.step;
  s["iterations"] = summary.counters.iteration;
  s["skipped_iterations"] = summary.counters.skipped_iterations;
  s["seconds"] = summary.seconds;
  if (!trainer.cuda_graph_plan().empty()) s["cuda_graph"] = trainer.cuda_graph_plan();
  s["malloc"] = process_malloc();
  s["environment"] = run_environment(run_device, to_string(mode), uses_grad_scaler(mode) && t.grad_scaler.enabled,
                                     group_names);
  if (caching_host_allocator_installed()) {
    const HostAllocatorStats h = host_allocator_stats();
    std::fprintf(out, "host allocator: %llu CPU allocations, %.1f %% reused from the cache (%.1f MiB cached; malloc: %s)\n",
                 static_cast<unsigned long long>(h.allocations),
                 h.allocations ? 100.0 * static_cast<double>(h.cache_hits) / static_cast<double>(h.allocations) : 0.0,
                 static_cast<double>(h.cached_bytes) / (1 << 20), process_malloc().c_str());
    s["host_allocator"] = {{"allocations", h.allocations}, {"cache_hits", h.cache_hits}, {"cached_bytes", h.cached_bytes}};
  } else {
    std::fprintf(out, "host allocator: LibTorch's (no cache; malloc: %s)\n", process_malloc().c_str());
  }
  if (summary.last_eval) s["val"] = summary.last_eval->metrics;
  if (test_data_) {
    auto test = eval_loader(test_data_(ctx), "/data/test");
    EvalResult r = trainer.evaluate(*test, "test");
    s["test"] = r.metrics;
  }
  if (group) s["world_size"] = world_size;
  if (!leader) return summary;
  std::ofstream(recipe_.output_dir / "summary.json") << s.dump(2) << "\n";
  write_training_plot(recipe_.output_dir / "metrics.jsonl", recipe_.output_dir / "training.svg");
  write_run_report(recipe_.output_dir);
  std::fprintf(out, "run directory: %s (report.html, metrics.jsonl, metrics.csv, training.svg, summary.json, checkpoints/)\n",
               recipe_.output_dir.c_str());
  return summary;
}

void Session::validate_built() const {
  auto models = build_models();
  BuildContext ctx{device(), recipe_.training.seed, recipe_.output_dir};
  if (!train_data_ || !objective_) return;  // reported by the constructor
  auto train = train_data_(ctx);
  DatasetPtr val = val_data_ ? val_data_(ctx) : nullptr;
  std::map<std::string, const Dataset*> sets;
  std::vector<DatasetPtr> keep;
  for (const auto& [name, builder] : data_sets_) keep.push_back(builder(ctx)), sets[name] = keep.back().get();
  std::vector<EvaluatorPtr> evaluators;
  for (const auto& e : evaluators_) evaluators.push_back(e(ctx));
  check_fields(models->model_map(), *train, val.get(), sets, *objective_(ctx), evaluators);
}

void Session::check_fields(const ModelMap& models, const Dataset& train, const Dataset* val,
                           const std::map<std::string, const Dataset*>& sets, const Objective& objective,
                           const std::vector<EvaluatorPtr>& evaluators) const {
  ConfigIssues issues;
  // Where a field comes from, for the message: a model input renamed by /models/i/inputs, or
  // read by the component itself.
  auto origin = [&](const std::string& field, const std::vector<std::string>& chain) -> std::string {
    for (const auto& name : chain)
      for (std::size_t i = 0; i < recipe_.models.size(); ++i) {
        const ModelEntry& m = recipe_.models[i];
        if (m.spec.name != name) continue;
        // An EMA model reads what its source reads.
        const ModelEntry* src = &m;
        if (m.ema)
          for (const auto& o : recipe_.models)
            if (o.spec.name == m.ema->of) src = &o;
        for (const auto& [model_field, data_field] : src->inputs)
          if (data_field == field)
            return " (model \"" + name + "\" reads its input \"" + model_field + "\" from it: " + src->pointer +
                   "/inputs/" + model_field + ")";
        auto it = models.find(name);
        if (it != models.end() && it->second)
          for (const auto& f : it->second->input_fields())
            if (f == field) return " (an input of model \"" + name + "\")";
      }
    return "";
  };
  auto check = [&](const std::vector<std::string>& needed, const Dataset& data, const std::string& data_pointer,
                   const std::string& who, const std::vector<std::string>& chain) {
    const auto produced = field_names(data.fields());
    std::string list;
    for (const auto& p : produced) list += (list.empty() ? "" : ", ") + p;
    for (const auto& f : missing_fields(needed, produced))
      issues.add(data_pointer, who + " reads the field \"" + f + "\"" + origin(f, chain) +
                                   ", which this data does not produce (it produces: " + list + ")" +
                                   did_you_mean(f, produced));
  };
  const auto needed = objective.required_fields(models);
  check(needed, train, "/data/train", "the objective", objective.required_models());
  if (val) check(needed, *val, "/data/val", "the objective", objective.required_models());
  for (std::size_t i = 0; i < evaluators.size(); ++i)
    for (const auto& [set, fields] : evaluators[i]->required_fields(models)) {
      auto it = sets.find(set);
      if (it != sets.end() && it->second)
        check(fields, *it->second, "/data/sets/" + set, "evaluator /evaluators/" + std::to_string(i),
              evaluators[i]->required_models());
    }
  issues.throw_if_any();
}

EvalResult Session::evaluate(const std::optional<std::filesystem::path>& checkpoint, const std::string& split,
                             std::FILE* out) const {
  if (split != "val" && split != "test")
    throw Error("unknown split \"" + split + "\" (expected val or test)" + did_you_mean(split, {"val", "test"}));
  if (split == "test" && !test_data_) throw Error("--split test: the recipe has no /data/test");
  if (split == "val" && !val_data_ && evaluators_.empty())
    throw Error("--split val: the recipe has neither /data/val nor /evaluators");
  auto dir = checkpoint ? checkpoint : latest_checkpoint(recipe_.output_dir / "checkpoints");
  if (!dir) throw Error("no checkpoint given and none in " + (recipe_.output_dir / "checkpoints").string() + " (train first)");
  auto models = build_models();
  load_trainable_weights(*dir, *models);
  const torch::Device run_device = device();
  BuildContext ctx{run_device, recipe_.training.seed, recipe_.output_dir};
  const TrainingSpec& t = recipe_.training;
  // The training loop's own evaluation (Trainer::evaluate, ::validate): the same autocast,
  // eval mode, scoped seed and evaluators as during training. (A Trainer wants training data and
  // an optimizer; neither is used.)
  TrainerParts parts;
  parts.models = models.get();
  parts.train = std::make_shared<DataLoader>(train_data_(ctx), LoaderOptions{t.batch_size, false, t.drop_last, t.seed});
  parts.objective = objective_(ctx);
  parts.optimizer = make_optimizer(recipe_.optimizer, models->parameter_groups(recipe_.optimizer));
  parts.training = t;
  parts.precision = precision();
  parts.device = run_device;
  std::shared_ptr<DataLoader> data;
  if (split == "val") {
    if (val_data_) parts.val = std::make_shared<DataLoader>(val_data_(ctx), LoaderOptions{t.batch_size, false, false, 0});
    for (const auto& [name, builder] : data_sets_)
      parts.eval_sets[name] = std::make_shared<LoaderEvalData>(builder(ctx), t.batch_size, run_device);
    for (const auto& e : evaluators_) parts.evaluators.push_back(e(ctx));
  } else {
    data = std::make_shared<DataLoader>(test_data_(ctx), LoaderOptions{t.batch_size, false, false, 0});
  }
  std::map<std::string, const Dataset*> sets;
  for (const auto& [name, set] : parts.eval_sets) sets[name] = &static_cast<const LoaderEvalData&>(*set).dataset();
  check_fields(models->model_map(), parts.train->dataset(), parts.val ? &parts.val->dataset() : data ? &data->dataset() : nullptr,
               sets, *parts.objective, parts.evaluators);
  Trainer trainer(std::move(parts));
  EvalResult r = split == "val" ? trainer.validate() : trainer.evaluate(*data, "test");
  std::string line = split + " (" + dir->string() + "):";
  char buf[96];
  for (const auto& [metric, value] : r.metrics) {
    std::snprintf(buf, sizeof buf, "  %s %.4f", metric.c_str(), value);
    line += buf;
  }
  if (r.count > 0) line += "  (" + std::to_string(r.count) + " samples)";
  std::fprintf(out, "%s\n", line.c_str());
  return r;
}

std::vector<std::filesystem::path> Session::export_models(const std::optional<std::filesystem::path>& checkpoint,
                                                          const std::string& format, const std::filesystem::path& out,
                                                          std::optional<c10::ScalarType> merged_dtype) const {
  if (format != "peft" && format != "merged")
    throw Error("unknown export format \"" + format + "\" (expected peft or merged)" + did_you_mean(format, {"peft", "merged"}));
  if (merged_dtype && format != "merged") throw Error("a dtype applies to merged exports only (--format merged)");
  auto models = build_models();
  auto dir = checkpoint ? checkpoint : latest_checkpoint(recipe_.output_dir / "checkpoints");
  if (!dir) throw Error("no checkpoint given and none in " + (recipe_.output_dir / "checkpoints").string() + " (train first)");
  load_trainable_weights(*dir, *models);
  std::vector<std::filesystem::path> written;
  if (format == "peft") {
    std::vector<std::tuple<std::string, std::string, AdapterFiles>> exports;
    for (const auto& m : models->models())
      for (const auto& [type, adapter] : m.adapters)
        if (adapter->format() == "peft") exports.emplace_back(m.spec.name, type, adapter->export_files(*m.model));
    if (exports.empty()) throw Error("no model in this recipe has an adapter with a PEFT format (e.g. lora)");
    for (const auto& [model, type, files] : exports) {
      // One adapter: PEFT's layout directly in <out>; several: one folder each.
      auto target = exports.size() == 1 ? out : out / (model + "-" + type);
      io::write_adapter_files(target, files);
      written.push_back(target / "adapter_model.safetensors");
      written.push_back(target / "adapter_config.json");
    }
    return written;
  }
  // An EMA model's frozen weights share its source's storage; merging writes into base weights,
  // so each model gets its own copy first (else the teacher would carry the student's delta).
  {
    torch::NoGradGuard no_grad;
    for (const auto& m : models->models())
      for (const auto& p : m.parameters)
        if (p.shared) p.tensor.set_data(p.tensor.detach().clone());
  }
  for (const auto& m : models->models()) {
    if (merged_dtype) {
      // Widened first: the merge then adds the delta to the exact base weight in float32.
      torch::NoGradGuard no_grad;
      for (auto& p : m.model->parameters(true))
        if (p.is_floating_point()) p.set_data(p.detach().to(torch::kFloat));
    }
    for (const auto& [type, adapter] : m.adapters) {
      adapter->merge(*m.model);  // in fp32, then cast to the weight's dtype
      adapter->eject(*m.model);
    }
    auto state = model_state(*m.model);
    if (merged_dtype)
      for (auto& kv : state)
        if (kv.second.is_floating_point()) kv.second = kv.second.to(*merged_dtype);
    auto file = out / (m.spec.name + ".safetensors");
    io::save_safetensors(file, state, {{"format", "pt"}, {"producer", "refit export --format merged"}});
    written.push_back(file);
  }
  return written;
}

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  std::ostringstream os;
  os << std::fixed << std::setprecision(u == 0 ? 0 : 1) << b << " " << units[u];
  return os.str();
}

struct Row {
  std::string name;
  std::int64_t params = 0, trainable = 0;
  std::set<std::string> dtypes;
  std::string device;
  double weight_bytes = 0, grad_bytes = 0, optim_bytes = 0;
};

}  // namespace

std::string Session::inspect(bool parameters) const {
  auto models = build_models();
  // Optimizer state per trainable element: AdamW/Adam keep exp_avg and exp_avg_sq, SGD with
  // momentum one buffer, all in the parameter's dtype.
  const std::string& opt = recipe_.optimizer.type;
  const int state_tensors = opt == "sgd" ? (recipe_.optimizer.momentum > 0 ? 1 : 0) : 2;
  std::vector<Row> rows;
  for (const auto& m : models->models()) {
    std::map<std::string, Row> by_owner;
    std::vector<std::string> order{""};
    for (const auto& p : m.parameters) {
      if (!by_owner.count(p.owner)) {
        if (!p.owner.empty()) order.push_back(p.owner);
        by_owner[p.owner].name = p.owner.empty() ? m.spec.name : "  + " + p.owner;
      }
      Row& r = by_owner[p.owner];
      const auto n = p.tensor.numel();
      // An EMA model's frozen parameters share its source's storage: no memory of their own.
      const double bytes = p.shared ? 0.0 : static_cast<double>(n) * p.tensor.element_size();
      r.params += n;
      r.dtypes.insert(dtype_name(p.tensor.scalar_type()));
      r.device = p.tensor.device().str();
      r.weight_bytes += bytes;
      if (p.trainable) {
        r.trainable += n;
        r.grad_bytes += bytes;
        r.optim_bytes += bytes * state_tensors;
      }
    }
    for (const auto& o : order)
      if (by_owner.count(o)) rows.push_back(by_owner[o]);
  }
  Row total;
  total.name = "total";
  for (const auto& r : rows) {
    total.params += r.params, total.trainable += r.trainable;
    total.weight_bytes += r.weight_bytes, total.grad_bytes += r.grad_bytes, total.optim_bytes += r.optim_bytes;
    total.dtypes.insert(r.dtypes.begin(), r.dtypes.end());
  }
  std::ostringstream os;
  os << "precision " << to_string(models->precision()) << ", optimizer " << opt << "\n";
  auto line = [&](const Row& r) {
    std::string dt;
    for (const auto& d : r.dtypes) dt += (dt.empty() ? "" : ",") + d;
    os << std::left << std::setw(22) << r.name << std::right << std::setw(12) << r.params << std::setw(12)
       << r.trainable << "  " << std::left << std::setw(18) << dt << std::setw(8) << r.device << std::right
       << std::setw(12) << human_bytes(r.weight_bytes) << std::setw(12) << human_bytes(r.grad_bytes) << std::setw(12)
       << human_bytes(r.optim_bytes) << "\n";
  };
  os << std::left << std::setw(22) << "model" << std::right << std::setw(12) << "params" << std::setw(12)
     << "trainable" << "  " << std::left << std::setw(18) << "dtype" << std::setw(8) << "device" << std::right
     << std::setw(12) << "weights" << std::setw(12) << "grads" << std::setw(12) << "optimizer" << "\n";
  for (const auto& r : rows) line(r);
  line(total);
  if (parameters) {
    // The optimizer group of each trainable parameter (1-D ones and biases may be in "<group>.no_decay").
    std::map<const void*, std::string> group_of;
    for (const auto& g : models->parameter_groups(recipe_.optimizer, weight_decay_exemptions(recipe_)))
      for (const auto& t : g.parameters) group_of[t.unsafeGetTensorImpl()] = g.name;
    std::size_t name_width = 6, path_width = 10, group_width = 14;
    for (const auto& [impl, group] : group_of) group_width = std::max(group_width, group.size() + 2);
    for (const auto& m : models->models()) {
      name_width = std::max(name_width, m.spec.name.size() + 2);
      for (const auto& p : m.parameters) path_width = std::max(path_width, p.path.size() + 2);
    }
    const int nw = static_cast<int>(name_width), pw = static_cast<int>(path_width);
    os << "\n" << std::left << std::setw(nw) << "model" << std::setw(pw) << "parameter" << std::setw(10) << "trainable"
       << std::setw(10) << "dtype" << std::setw(18) << "shape" << std::setw(static_cast<int>(group_width)) << "group" << "declared by\n";
    for (const auto& m : models->models())
      for (const auto& p : m.parameters) {
        std::string shape = "[";
        for (std::size_t d = 0; d < static_cast<std::size_t>(p.tensor.dim()); ++d)
          shape += (d ? ", " : "") + std::to_string(p.tensor.size(static_cast<std::int64_t>(d)));
        shape += "]";
        os << std::left << std::setw(nw) << m.spec.name << std::setw(pw) << p.path << std::setw(10)
           << (p.trainable ? "yes" : (p.ema_source.defined() ? "ema" : "no")) << std::setw(10)
           << dtype_name(p.tensor.scalar_type()) << std::setw(18) << shape << std::setw(static_cast<int>(group_width))
           << (group_of.count(p.tensor.unsafeGetTensorImpl()) ? group_of.at(p.tensor.unsafeGetTensorImpl()) : "-")
           << (p.owner.empty() ? "model" : p.owner) << "\n";
      }
  }
  return os.str();
}

}  // namespace refit
