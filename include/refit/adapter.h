#pragma once
// An adapter changes a model after it is built and before it is registered: it injects
// submodules (LoRA factors, heads) and declares the role/dtype of what it injected.
#include <memory>
#include <string>
#include <vector>

#include "refit/model.h"
#include "refit/model_spec.h"

namespace refit {

class Adapter {
 public:
  virtual ~Adapter() = default;
  /// Injects into `model`; called once, before registration.
  virtual void attach(Model& model) = 0;
  /// Declarations for the injected parameters (trainable fp32 by default).
  virtual std::vector<ParameterRule> parameter_rules() const = 0;
};

using AdapterPtr = std::shared_ptr<Adapter>;

}  // namespace refit
