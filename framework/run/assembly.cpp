#include "run/assembly.h"

#include <algorithm>
#include <set>

#include <torch/utils.h>

#include "distributed/world.h"
#include "evaluators/evaluators.h"
#include "core/recipe_parser.h"
#include "io/adapter_files.h"
#include "model/weights.h"
#include "refit/regex.h"
#include "objectives/causal_lm.h"
#include "objectives/classification.h"
#include "train/checkpoint.h"

namespace refit {

void register_builtins(Registry& registry) {
  Provenance saved = registry.current_provenance();
  registry.set_current_provenance(Provenance{"refit (built-in)", nullptr});
  register_classification_objective(registry);
  register_causal_lm_objective(registry);
  register_builtin_evaluators(registry);
  registry.set_current_provenance(saved);
}

Assembly::Assembly(Recipe recipe) : recipe_(std::move(recipe)) {
  register_builtins(registry_);
  load_plugins();
  resolve_components();
  check_references();
  recipe_.issues->throw_if_any();
}

void Assembly::load_plugins() {
  for (std::size_t i = 0; i < recipe_.plugins.size(); ++i) {
    try {
      loader_.load(recipe_.plugins[i], recipe_.plugin_paths, recipe_.base_dir);
    } catch (const std::exception& e) {
      recipe_.issues->add("/plugins/load/" + std::to_string(i), e.what());
    }
  }
}

void Assembly::resolve_components() {
  ConfigIssues& issues = *recipe_.issues;
  auto parse = [](const auto& table, const ComponentSpec& c) { return table.parse(c.type, c.type_pointer, *c.config); };
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
    } else {
      if (!m.component.type.empty()) b.model = parse(registry_.models, m.component);
      for (const auto& a : m.adapters)
        if (!a.type.empty()) b.adapters.push_back(parse(registry_.adapters, a));
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
}

namespace {

/// Where a name a component requires is written: the config value that holds it when there is
/// one ("/objective/config/teacher/1"), else `fallback`.
std::string where_named(const ConfigReader& config, const std::string& name, const std::string& fallback) {
  if (!config.is_object()) return fallback;
  for (const auto& [key, value] : config.raw().items()) {
    if (value.is_string() && value.get<std::string>() == name) return config.pointer_to(key);
    if (value.is_array())
      for (std::size_t k = 0; k < value.size(); ++k)
        if (value[k].is_string() && value[k].get<std::string>() == name)
          return config.pointer_to(key) + "/" + std::to_string(k);
  }
  return fallback;
}

}  // namespace

void Assembly::check_references() {
  ConfigIssues& issues = *recipe_.issues;
  // The models and data sets that the objective and evaluators read must be declared.
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
    issues.add("/output/checkpoints/metric", "no evaluation reports the metric \"" + ck.metric + "\" (reported: " +
                                                 (list.empty() ? std::string("none: add /data/val or /evaluators") : list) +
                                                 ")" + did_you_mean(ck.metric, reported));
  }
  // Early stopping judges validations: it needs a metric one reports, and validations during
  // the run (without /training/eval_every there is only the final one).
  const EarlyStoppingSpec& es = recipe_.training.early_stopping;
  if (es.enabled && !metric_owner.count(es.metric)) {
    std::vector<std::string> reported;
    std::string list;
    for (const auto& [m, who] : metric_owner) reported.push_back(m), list += (list.empty() ? "" : ", ") + m;
    issues.add("/training/early_stopping/metric", "no evaluation reports the metric \"" + es.metric + "\" (reported: " +
                                                      (list.empty() ? std::string("none: add /data/val") : list) + ")" +
                                                      did_you_mean(es.metric, reported));
  }
  if (es.enabled && !recipe_.training.eval_every)
    issues.add("/training/early_stopping",
               "early stopping judges the validations during the run, but /training/eval_every is not set");
  if (ck.enabled && ck.keep_best > 0 && !recipe_.training.eval_every)
    issues.add("/output/checkpoints/keep_best",
               "keep_best ranks checkpoints by an evaluation of their own weights (a checkpoint is written after each "
               "evaluation), but /training/eval_every is not set (only the final checkpoint would be evaluated)");
}

torch::Device Assembly::device() const {
  torch::Device d = resolve_device(recipe_.training.device);
  // One process per device: under torchrun, LOCAL_RANK picks the CUDA device of this rank.
  if (d.is_cuda() && !d.has_index())
    if (auto world = world_from_environment())
      return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world->local_rank));
  return d;
}

Precision Assembly::precision() const {
  if (recipe_.training.precision) return *recipe_.training.precision;
  // "auto": bf16-mixed where the device computes bf16 fast (CUDA), fp32 on CPUs (most lack
  // fast bf16 matmul, and fp32 is the safe reference there). See docs/precision.md.
  return device().is_cuda() ? Precision::bf16_mixed : Precision::fp32;
}

std::filesystem::path Assembly::checkpoint_to_restore(const std::optional<std::filesystem::path>& given) const {
  if (given) return *given;
  const auto root = recipe_.output_dir / "checkpoints";
  auto latest = latest_checkpoint(root);
  if (!latest) throw Error("no checkpoint given and none in " + root.string() + " (train first)");
  return *latest;
}

BuildContext Assembly::context() const { return BuildContext{device(), recipe_.training.seed, recipe_.output_dir}; }

namespace {

/// The model's blocks /models/<i>/gradient_checkpointing chooses; throws naming the key when the
/// model has none or the regex matches none.
std::set<std::string> checkpointed_blocks(const Model& model, const ModelEntry& entry) {
  const std::string where = entry.pointer + "/gradient_checkpointing";
  const std::vector<std::string> blocks = model.checkpointable_blocks();
  if (blocks.empty())
    throw Error(where + ": model type \"" + entry.component.type +
                "\" lists no blocks whose activations can be recomputed (Model::checkpointable_blocks)");
  std::string error;
  const auto re = compile_regex(*entry.gradient_checkpointing, &error);
  if (!re) throw Error(where + ": " + error);
  std::set<std::string> chosen;
  for (const auto& b : blocks)
    if (regex_full_match(b, *re)) chosen.insert(b);
  if (chosen.empty())
    throw Error(where + ": \"" + *entry.gradient_checkpointing + "\" matches none of the model's blocks (" + blocks.front() +
                " ... " + blocks.back() + ")");
  return chosen;
}

}  // namespace

ModelPtr Assembly::build_model(const ModelEntry& entry, const ModelBuild& build, const BuildContext& ctx, ModelSpec& spec,
                               std::vector<std::string>& owners, std::vector<std::pair<std::string, AdapterPtr>>& adapters,
                               LoadedWeights& loaded, bool fresh_adapters) const {
  // A model whose weights follow is built from placeholders (BuildContext::weights_follow) and
  // filled in its declared dtypes and storage: a billion parameters never exist in float32.
  BuildContext model_ctx = ctx;
  model_ctx.weights_follow = entry.weights.has_value();
  ModelPtr model = build.model(model_ctx);
  model->set_input_mapping(entry.inputs);
  if (entry.gradient_checkpointing) model->set_checkpointed_blocks(checkpointed_blocks(*model, entry));
  if (entry.weights) {
    try {
      loaded = load_weights(*model, *entry.weights, entry.spec.name, weight_targets(entry.spec, *model));
    } catch (const Error& e) {
      throw Error(entry.pointer + "/weights: " + e.what());
    }
  }
  for (std::size_t a = 0; a < build.adapters.size(); ++a) {
    AdapterPtr adapter = build.adapters[a](ctx);
    if (!fresh_adapters && !entry.adapter_loads[a] && adapter->identity_when_fresh()) continue;
    try {
      adapter->attach(*model);
      if (entry.adapter_loads[a]) adapter->import_files(*model, io::read_adapter_files(*entry.adapter_loads[a]));
    } catch (const std::exception& e) {
      throw Error(entry.pointer + "/adapters/" + std::to_string(a) + ": " + e.what());
    }
    // Several adapters of one type on a model are told apart by the names they give themselves
    // (lora's "name"), in inspect's rows and export's folders: "lora-<name>".
    std::string label = entry.adapters[a].type;
    if (const std::string own = adapter->name(); !own.empty()) label += "-" + own;
    for (auto& rule : adapter->parameter_rules()) {
      spec.rules.push_back(rule);
      owners.push_back(label);
    }
    adapters.emplace_back(label, adapter);
  }
  return model;
}

std::unique_ptr<ModelRegistry> Assembly::build_models(bool fresh_adapters) const {
  const torch::Device run_device = device();
  auto registry = std::make_unique<ModelRegistry>(precision());
  torch::manual_seed(recipe_.training.seed);
  const BuildContext ctx = context();
  for (std::size_t i = 0; i < recipe_.models.size(); ++i) {
    const ModelEntry& declared = recipe_.models[i];
    // An EMA model is built exactly like its source; then registration mirrors the source.
    const int source = model_builders_[i].source;
    const ModelEntry& entry = source >= 0 ? recipe_.models[source] : declared;
    const ModelBuild& build = model_builders_[source >= 0 ? source : i];
    const torch::Device model_device = declared.spec.device == "auto" ? run_device : resolve_device(declared.spec.device);
    ModelSpec spec = entry.spec;
    std::vector<std::string> owners(spec.rules.size(), "");
    std::vector<std::pair<std::string, AdapterPtr>> adapters;
    LoadedWeights loaded;
    ModelPtr model = build_model(entry, build, ctx, spec, owners, adapters, loaded, fresh_adapters);
    try {
      if (declared.ema) registry->add_ema(model, declared.spec, *declared.ema, model_device, std::move(adapters));
      else
        registry->add(model, spec, model_device, owners, std::move(adapters));
    } catch (const Error& e) {
      throw Error(declared.pointer + ": " + e.what());
    }
    if (!loaded.digest.empty()) registry->set_loaded_weights(declared.spec.name, std::move(loaded));
  }
  if (fresh_adapters) registry->validate_complete();
  return registry;
}

DatasetPtr Assembly::train_data() const { return train_data_(context()); }
DatasetPtr Assembly::val_data() const { return val_data_ ? val_data_(context()) : nullptr; }
DatasetPtr Assembly::test_data() const { return test_data_ ? test_data_(context()) : nullptr; }

std::vector<std::pair<std::string, DatasetPtr>> Assembly::data_sets() const {
  std::vector<std::pair<std::string, DatasetPtr>> sets;
  for (const auto& [name, builder] : data_sets_) sets.emplace_back(name, builder(context()));
  return sets;
}

DatasetPtr Assembly::dataset(const Json& component, const std::filesystem::path& base_dir, const std::string& where) {
  check_json_depth(component, where);
  ConfigReader root = ConfigReader::root(component, base_dir);
  const std::string type = root.required<std::string>("type");
  ConfigReader config = root.child("config", /*required_key=*/false, /*detached=*/true);
  Builder<Dataset> build;
  if (!type.empty()) build = registry_.datasets.parse(type, root.pointer_to("type"), config);
  root.finish();
  if (!root.issues().empty()) {
    std::vector<ConfigIssue> issues;
    for (const auto& i : root.issues().list()) issues.push_back({where + i.pointer, i.message});
    throw ConfigError(std::move(issues));
  }
  return build(context());
}

ObjectivePtr Assembly::objective() const { return objective_(context()); }

std::vector<EvaluatorPtr> Assembly::evaluators() const {
  std::vector<EvaluatorPtr> out;
  for (const auto& e : evaluators_) out.push_back(e(context()));
  return out;
}

std::vector<CallbackPtr> Assembly::callbacks() const {
  std::vector<CallbackPtr> out;
  for (const auto& c : callbacks_) out.push_back(c(context()));
  return out;
}

void Assembly::check_fields(const ModelMap& models,
                            const std::vector<std::pair<std::string, const Dataset*>>& objective_data,
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
            return " (model \"" + name + "\" reads its input \"" + model_field + "\" from it: " + src->pointer + "/inputs/" +
                   model_field + ")";
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
  for (const auto& [pointer, data] : objective_data)
    if (data) check(needed, *data, pointer, "the objective", objective.required_models());
  for (std::size_t i = 0; i < evaluators.size(); ++i)
    for (const auto& [set, fields] : evaluators[i]->required_fields(models)) {
      auto it = sets.find(set);
      if (it != sets.end() && it->second)
        check(fields, *it->second, "/data/sets/" + set, "evaluator /evaluators/" + std::to_string(i),
              evaluators[i]->required_models());
    }
  issues.throw_if_any();
}

}  // namespace refit
