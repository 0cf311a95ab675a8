#pragma once
// The small adaptable models the LoRA/DoRA golden data was generated for
// (tests/golden/make_lora_peft.py, make_dora_peft.py, make_lora_combine.py): shared by the unit
// tests (lora_support.h) and the adapter fuzz target, so both attach adapters to the same layers.
#include <memory>

#include "refit/layers.h"
#include "refit/model.h"

namespace refit::lora_test {

/// One adaptable Linear 8 -> 6 named "proj".
class LinearNet : public TensorModel {
 public:
  LinearNet() { proj = register_module("proj", std::make_shared<nn::Linear>(8, 6)); }
  torch::Tensor forward(const torch::Tensor& x) override { return proj->forward(x); }
  std::shared_ptr<nn::Linear> proj;
};

/// One adaptable Conv2d 3 -> 4, kernel 3, padding 1, named "conv".
class ConvNet : public TensorModel {
 public:
  ConvNet() {
    nn::Conv2dOptions o;
    o.in_channels = 3, o.out_channels = 4, o.kernel_size = {3, 3}, o.padding = {1, 1};
    conv = register_module("conv", std::make_shared<nn::Conv2d>(o));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return conv->forward(x); }
  std::shared_ptr<nn::Conv2d> conv;
};

}  // namespace refit::lora_test
