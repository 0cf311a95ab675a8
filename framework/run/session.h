#pragma once
// A Session turns a parsed Recipe into running parts: it loads the recipe's plugins, resolves
// and parses every component config (collecting all problems), and builds models, data,
// objective, optimizer and callbacks for `refit train`, `refit inspect` and `refit validate`.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/plugin_loader.h"
#include "core/recipe.h"
#include "model/model_registry.h"
#include "refit/registry.h"
#include "train/trainer.h"

namespace refit {

/// Registers what ships inside the framework (the classification objective).
void register_builtins(Registry& registry);

class Session {
 public:
  /// Loads plugins and parses every component config. Throws ConfigError listing every problem
  /// (recipe keys, plugin loading, unknown factory types, factory configs, model references).
  explicit Session(Recipe recipe);

  const Recipe& recipe() const { return recipe_; }
  const PluginLoader& plugins() const { return loader_; }
  Registry& registry() { return registry_; }

  torch::Device device() const;
  Precision precision() const;

  /// Builds every model, attaches its adapters, and registers it (applying its spec).
  std::unique_ptr<ModelRegistry> build_models() const;

  /// Builds everything and trains; progress goes to `out`. `extra` callbacks run after the
  /// recipe's (benchmarks and embedding programs observe the loop through them).
  TrainSummary train(std::FILE* out, std::vector<CallbackPtr> extra = {}) const;

  /// `refit validate` beyond the recipe: builds the models (the registry's dtype and precision
  /// checks) and the data, and checks the fields (check_fields). Throws on the first failure to
  /// build, or a ConfigError with every missing field.
  void validate_built() const;

  /// Every field the objective and the evaluators read — their models' inputs under the recipe's
  /// mapping, and what they read themselves ("labels") — is produced by the data they read.
  /// Throws ConfigError naming each missing field, where it is needed and what the data produces.
  void check_fields(const ModelMap& models, const Dataset& train, const Dataset* val,
                    const std::map<std::string, const Dataset*>& sets, const Objective& objective,
                    const std::vector<EvaluatorPtr>& evaluators) const;

  /// The `refit inspect` table; with `parameters`, then one line per parameter (model, path,
  /// trainable, dtype, shape, optimizer group, declaring adapter).
  std::string inspect(bool parameters = false) const;

  /// `refit evaluate`: restores the trainable weights of `checkpoint` (default: the run's latest)
  /// and evaluates them on `split` exactly as training does — "val": the objective on /data/val
  /// and every evaluator (a validation); "test": the objective on /data/test. Prints one line to
  /// `out` and returns the result.
  EvalResult evaluate(const std::optional<std::filesystem::path>& checkpoint, const std::string& split,
                      std::FILE* out) const;

  /// `refit export`: restores the trainable weights of `checkpoint` (default: the run's latest)
  /// and writes adapters in their interchange format ("peft") or every model with its adapters
  /// merged ("merged": <out>/<model>.safetensors). Merged weights are written in their registered
  /// dtypes, or, with `merged_dtype`, merged in float32 and written in that dtype (float32 keeps
  /// the whole delta of a bf16 base). Returns the files written.
  std::vector<std::filesystem::path> export_models(const std::optional<std::filesystem::path>& checkpoint,
                                                   const std::string& format, const std::filesystem::path& out,
                                                   std::optional<c10::ScalarType> merged_dtype = std::nullopt) const;

 private:
  struct ModelBuild {
    int source = -1;  // an EMA model: index of the entry it mirrors (whose builders are used)
    Builder<Model> model;
    std::vector<Builder<Adapter>> adapters;
    std::vector<std::string> adapter_names;
  };
  // Declaration order is destruction order reversed, and it matters: plugin code (factory
  // parse functions) creates objects that end up inside the recipe (nested ConfigReader states),
  // so the recipe must be destroyed first, while the builders and the registry still keep
  // every plugin library mapped.
  Registry registry_;
  PluginLoader loader_{registry_};
  std::vector<ModelBuild> model_builders_;
  Builder<Dataset> train_data_, val_data_, test_data_;
  Builder<Objective> objective_;
  std::vector<Builder<Callback>> callbacks_;
  std::vector<Builder<Evaluator>> evaluators_;
  std::vector<std::pair<std::string, Builder<Dataset>>> data_sets_;
  Recipe recipe_;
};

}  // namespace refit
