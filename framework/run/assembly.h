#pragma once
// An Assembly turns a parsed Recipe into the parts a run is made of. Constructing it loads the
// recipe's plugins, resolves every component against the registry, parses every component
// config and checks the cross-references (models and data sets named by the objective and the
// evaluators, the checkpoint metric), collecting every problem into one ConfigError. Nothing is
// built yet: each verb asks only for the parts it uses (`refit inspect` the models, `refit
// evaluate` models, data and evaluators, `refit train` everything), built the same way for all.
#include <filesystem>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/plugin_loader.h"
#include "core/recipe.h"
#include "model/model_registry.h"
#include "refit/registry.h"

namespace refit {

/// Registers what ships inside the framework (the classification objective, the evaluators).
void register_builtins(Registry& registry);

class Assembly {
 public:
  /// Loads plugins and parses every component config. Throws ConfigError listing every problem
  /// (recipe keys, plugin loading, unknown factory types, factory configs, model references).
  explicit Assembly(Recipe recipe);

  const Recipe& recipe() const { return recipe_; }
  const PluginLoader& plugins() const { return loader_; }

  /// The run's device: /training/device, under torchrun the rank's own CUDA device.
  torch::Device device() const;
  /// /training/precision, or "auto": bf16-mixed on CUDA, fp32 on CPUs (docs/precision.md).
  Precision precision() const;
  /// The checkpoint a verb restores: `given`, else the newest in the run's checkpoints/ folder
  /// (an Error naming the folder when it holds none).
  std::filesystem::path checkpoint_to_restore(const std::optional<std::filesystem::path>& given) const;
  /// What factories receive: the device, the seed, the run folder.
  BuildContext context() const;

  /// Builds every model, attaches its adapters, and registers it (applying its spec).
  /// `fresh_adapters` false (generation without a checkpoint): adapters that are not loaded from
  /// files and are the identity when fresh (Adapter::identity_when_fresh: plain LoRA, whose B is
  /// zero) are left out, since they change nothing but the time; the set then needs no trainable
  /// parameter.
  std::unique_ptr<ModelRegistry> build_models(bool fresh_adapters = true) const;

  bool has_val_data() const { return static_cast<bool>(val_data_); }
  bool has_test_data() const { return static_cast<bool>(test_data_); }
  bool has_evaluators() const { return !evaluators_.empty(); }
  DatasetPtr train_data() const;
  DatasetPtr val_data() const;   // nullptr without /data/val
  DatasetPtr test_data() const;  // nullptr without /data/test
  /// /data/sets, by name, in recipe order.
  std::vector<std::pair<std::string, DatasetPtr>> data_sets() const;
  /// A dataset described outside the recipe (`refit predict --input`): a component
  /// {"type": ..., "config": {...}} resolved against the recipe's plugins; relative paths resolve
  /// against `base_dir`. Throws ConfigError naming every problem under `where`.
  DatasetPtr dataset(const Json& component, const std::filesystem::path& base_dir, const std::string& where);
  ObjectivePtr objective() const;
  std::vector<EvaluatorPtr> evaluators() const;
  /// The recipe's /callbacks, in order.
  std::vector<CallbackPtr> callbacks() const;

  /// Every field the objective and the evaluators read — their models' inputs under the recipe's
  /// mapping, and what they read themselves ("labels") — is produced by the data they read:
  /// `objective_data` by its pointer ("/data/train"), `sets` by /data/sets name. Throws
  /// ConfigError naming each missing field, where it is needed and what the data produces.
  void check_fields(const ModelMap& models, const std::vector<std::pair<std::string, const Dataset*>>& objective_data,
                    const std::map<std::string, const Dataset*>& sets, const Objective& objective,
                    const std::vector<EvaluatorPtr>& evaluators) const;

 private:
  struct ModelBuild {
    int source = -1;  // an EMA model: index of the entry it mirrors (whose builders are used)
    Builder<Model> model;
    std::vector<Builder<Adapter>> adapters;
  };
  void load_plugins();
  void resolve_components();
  void check_references();
  /// Builds, loads and attaches adapters; `loaded` gets what load_weights() read (nothing when
  /// the entry names no weights).
  ModelPtr build_model(const ModelEntry& entry, const ModelBuild& build, const BuildContext& ctx, ModelSpec& spec,
                       std::vector<std::string>& owners, std::vector<std::pair<std::string, AdapterPtr>>& adapters,
                       LoadedWeights& loaded, bool fresh_adapters = true) const;

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
