#pragma once
// DINO's projection head (facebookresearch/dino, vision_transformer.py DINOHead):
//   mlp: Linear(in, hidden) GELU [Linear(hidden, hidden) GELU]* Linear(hidden, bottleneck)
//   x = normalize(mlp(x), p=2, dim=-1)
//   logits = x @ (g * v / ||v||_row)^T        (weight-normalised prototypes, no bias)
// Parameter names are DINO's: mlp.0.weight, mlp.0.bias, mlp.2.weight, ..., last_layer.weight_v
// and last_layer.weight_g. With norm_last_layer (DINO's default) g is fixed at 1: it is a buffer,
// not a parameter, so no optimizer or EMA ever moves it.
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/nn/modules/container/sequential.h>

#include "refit/config.h"
#include "refit/layers.h"
#include "refit/model.h"

namespace refit::dino {

struct DinoHeadOptions {
  std::int64_t in_dim = 0;
  std::int64_t out_dim = 65536;  // prototypes
  std::int64_t hidden_dim = 2048;
  std::int64_t bottleneck_dim = 256;
  std::int64_t layers = 3;  // Linear layers in the MLP (>= 1)
  bool norm_last_layer = true;
  static DinoHeadOptions from_config(const ConfigReader& c);
};

class WeightNormLinear : public torch::nn::Module {
 public:
  WeightNormLinear(std::int64_t in, std::int64_t out, bool fixed_norm);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight_v, weight_g;
};

/// Reads "features", outputs "logits" (the prototype scores).
class DinoHead : public TensorModel {
 public:
  explicit DinoHead(DinoHeadOptions options);
  torch::Tensor forward(const torch::Tensor& input) override;
  const DinoHeadOptions& options() const { return options_; }

 private:
  DinoHeadOptions options_;
  std::vector<std::shared_ptr<refit::nn::Linear>> linears_;
  std::shared_ptr<WeightNormLinear> last_layer_;
};

}  // namespace refit::dino
