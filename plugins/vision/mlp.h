#pragma once
// A multi-layer perceptron: adaptable Linear layers named layers.0, layers.1, ... (the names are
// the weights-file and LoRA-target contract).
#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>

#include "refit/config.h"
#include "refit/layers.h"
#include "refit/model.h"

namespace refit::vision {

struct MlpOptions {
  std::int64_t in_features = 0;
  std::vector<std::int64_t> hidden;
  std::int64_t out_features = 0;
  std::string activation = "relu";  // relu, gelu, tanh
  bool flatten = true;              // flatten [B, ...] inputs to [B, in_features]
  double dropout = 0.0;             // after each hidden activation (training mode only)

  static MlpOptions from_config(const ConfigReader& c);
};

/// Reads the field "features" ([B, ...], flattened to [B, in_features]); outputs "output".
class Mlp : public TensorModel {
 public:
  explicit Mlp(MlpOptions options);
  torch::Tensor forward(const torch::Tensor& input) override;
  /// "layers.<i>" for each hidden layer (its Linear, activation and dropout); not the output layer.
  std::vector<std::string> checkpointable_blocks() const override;

 private:
  torch::Tensor hidden_block(std::size_t i, const torch::Tensor& input);
  MlpOptions options_;
  torch::nn::ModuleList layers_container_;
  std::vector<std::shared_ptr<refit::nn::Linear>> layers_;
};

}  // namespace refit::vision
