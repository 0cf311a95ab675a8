#pragma once
// The model interface: a torch Module with one tensor-to-tensor forward.
#include <memory>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace refit {

/// Every model the framework runs. Parameter and submodule names are the model's public
/// contract: weights files, LoRA targets and adapter files all refer to them.
class Model : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
};

using ModelPtr = std::shared_ptr<Model>;

}  // namespace refit
