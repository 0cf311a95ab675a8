#pragma once
// An adapter changes a model after it is built and before it is registered: it injects
// submodules (LoRA factors, heads) and declares the role/dtype of what it injected. Adapters
// that have an interchange format (PEFT for LoRA) also export and import it; the framework does
// the file I/O (safetensors, JSON) so that plugins need nothing beyond this SDK.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "refit/model.h"
#include "refit/model_spec.h"

namespace refit {

/// Tensors and config of an adapter in an interchange format (PEFT: adapter_model.safetensors
/// keys and adapter_config.json).
struct AdapterFiles {
  std::map<std::string, torch::Tensor> tensors;
  nlohmann::json config;
};

class Adapter {
 public:
  virtual ~Adapter() = default;
  /// Injects into `model`; called once, before registration.
  virtual void attach(Model& model) = 0;
  /// Declarations for the injected parameters (trainable fp32 by default).
  virtual std::vector<ParameterRule> parameter_rules() const = 0;
  /// The name this adapter gives itself, "" for none. Several adapters of one type on a model are
  /// told apart by it: `refit inspect` rows and export folders say "<type>-<name>".
  virtual std::string name() const { return ""; }

  /// Enables or disables the adapter's effect without removing it.
  virtual void set_active(Model&, bool) {}
  /// Folds the adapter into the base weights (forward unchanged, adapter inactive) / undoes it.
  virtual void merge(Model&) { throw std::runtime_error("this adapter cannot be merged"); }
  virtual void unmerge(Model&) { throw std::runtime_error("this adapter cannot be unmerged"); }
  /// Removes everything attach() injected (after merge: the model is a plain base model again).
  virtual void eject(Model&) { throw std::runtime_error("this adapter cannot be ejected"); }

  /// Whether this adapter, freshly attached (not loaded from files), leaves the model's outputs
  /// exactly as they were (LoRA: B is zero), so that `refit generate --checkpoint none` may leave
  /// it out. Default false: kept.
  virtual bool identity_when_fresh() const { return false; }

  /// The interchange format's name ("peft"), or "" when there is none.
  virtual std::string format() const { return ""; }
  virtual AdapterFiles export_files(const Model&) const { throw std::runtime_error("no export format"); }
  /// Loads tensors (and checks the config) written in the interchange format.
  virtual void import_files(Model&, const AdapterFiles&) { throw std::runtime_error("no import format"); }
};

using AdapterPtr = std::shared_ptr<Adapter>;

}  // namespace refit
