#pragma once
// The model registry: every model is declared (ModelSpec) before it is registered, and
// registration makes the declaration true in place, or refuses it with an actionable error.
//
//   frozen    -> requires_grad=false, parameters and buffers cast to the declared dtype
//   trainable -> requires_grad=true, parameters kept float32 (master weights) unless the run is
//                bf16-true and the model explicitly declares bfloat16
//   adapters' parameter rules override the model's role per parameter path
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "core/recipe.h"
#include "model/weights.h"
#include "precision/mode.h"
#include "refit/adapter.h"
#include "refit/model.h"
#include "refit/model_spec.h"
#include "refit/objective.h"

namespace refit {

/// One parameter after registration.
struct RegisteredParameter {
  std::string path;      // relative to its model
  torch::Tensor tensor;  // the module's own Parameter (same identity as in the module)
  bool trainable = false;
  std::string group;         // optimizer group ("<model>" or a rule's group)
  std::string owner;         // "" for the model itself, else the adapter that declared it
  bool shared = false;       // an EMA model's frozen parameter: same storage as its source's
  torch::Tensor ema_source;  // an EMA model's copy of this trainable source parameter
  /// Trained weights and EMA copies change during training: checkpoints hold them, the base
  /// fingerprint excludes them.
  bool changes_in_training() const { return trainable || ema_source.defined(); }
};

struct RegisteredModel {
  ModelSpec spec;
  ModelPtr model;
  torch::Device device = torch::kCPU;
  std::vector<RegisteredParameter> parameters;
  std::vector<std::pair<std::string, AdapterPtr>> adapters;  // (adapter type, object), as attached
  std::optional<EmaSpec> ema;                                // set for an EMA model
  /// What load_weights() read into the model itself (digest empty when the model was not loaded
  /// from a file): the base fingerprint hashes the digest instead of those parameters' bytes.
  LoadedWeights weights;
};

/// A parameter group for the optimizer, with every override resolved.
struct ParameterGroup {
  std::string name;
  std::vector<torch::Tensor> parameters;
  double lr = 0, weight_decay = 0, eps = 0;
  std::pair<double, double> betas{0.9, 0.999};
};

/// Exempt from weight decay by default: 1-D parameters (biases, norm scales, LayerScale) and
/// parameters whose name ends in "bias".
bool is_1d_or_bias(const std::string& path, const torch::Tensor& parameter);

/// Where a weights file's tensors go for a model declared `spec` (model/weights.h): each
/// parameter in the dtype its declaration gives it (the model's role and dtype, then the
/// recipe's rules; adapters' rules name the adapters' own parameters, created after the load),
/// and, for a quantized storage, each adaptable Linear weight packed as it is read. Registration
/// then finds every tensor already in place: nothing is held twice, nor in float32. The layers
/// `model` keeps dense (Model::dense_layers) are read like other parameters.
WeightTargets weight_targets(const ModelSpec& spec, const Model& model);

/// Resolves "auto", "cpu", "cuda", "cuda:N"; throws refit::Error for an unusable device.
torch::Device resolve_device(const std::string& name);

class ModelRegistry {
 public:
  explicit ModelRegistry(Precision precision) : precision_(precision) {}

  /// Applies `spec` to `model` in place and registers it. `owners` names, per rule index, the
  /// adapter that declared the rule (for `refit inspect`). Throws refit::Error on an unsafe or
  /// impossible declaration; nothing is registered then.
  const RegisteredModel& add(ModelPtr model, ModelSpec spec, torch::Device device,
                             const std::vector<std::string>& owners = {},
                             std::vector<std::pair<std::string, AdapterPtr>> adapters = {});

  /// Registers `model`, built exactly like the registered model `ema.of` (same factory, config,
  /// weights and adapters), as its exponential moving average: frozen parameters are made to
  /// share the source's storage (no memory), each trainable source parameter gets a frozen copy
  /// in `spec.dtype`, which must be float32 (as trainable parameters are): an EMA step moves a
  /// weight by (1 - momentum) of the difference, below bfloat16/float16 resolution.
  const RegisteredModel& add_ema(ModelPtr model, ModelSpec spec, const EmaSpec& ema, torch::Device device,
                                 std::vector<std::pair<std::string, AdapterPtr>> adapters = {});

  /// Records what load_weights() read into the registered model `name`: the frozen base's
  /// fingerprint then hashes the digest instead of those parameters' bytes (train/checkpoint.h).
  void set_loaded_weights(const std::string& name, LoadedWeights weights);

  /// Checks what only the whole set can tell (at least one trainable parameter).
  void validate_complete() const;

  /// One group per trainable model, plus one per distinct rule group; then, where a group decays
  /// weights and exempts 1-D parameters and biases (`exempt` by group name, else
  /// defaults.exempt_1d_and_bias), those move to a group "<group>.no_decay" right after it, with
  /// weight_decay 0 (a group left empty is dropped).
  std::vector<ParameterGroup> parameter_groups(const OptimizerSpec& defaults,
                                               const std::map<std::string, bool>& exempt = {}) const;

  const std::vector<RegisteredModel>& models() const { return models_; }
  ModelMap model_map() const;
  Precision precision() const { return precision_; }

 private:
  Precision precision_;
  std::vector<RegisteredModel> models_;
  std::map<const void*, std::string> seen_;  // TensorImpl* -> "model:path"
};

}  // namespace refit
