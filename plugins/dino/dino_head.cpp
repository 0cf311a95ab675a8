#include "dino_head.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>

namespace refit::dino {

DinoHeadOptions DinoHeadOptions::from_config(const ConfigReader& c) {
  DinoHeadOptions o;
  o.in_dim = c.required<std::int64_t>("in_dim");
  if (c.has("in_dim") && o.in_dim <= 0) c.error("in_dim", "expected a positive integer");
  o.out_dim = c.number_in<std::int64_t>("out_dim", o.out_dim, 1, 1 << 24);
  o.hidden_dim = c.number_in<std::int64_t>("hidden_dim", o.hidden_dim, 1, 1 << 20);
  o.bottleneck_dim = c.number_in<std::int64_t>("bottleneck_dim", o.bottleneck_dim, 1, 1 << 20);
  o.layers = c.number_in<std::int64_t>("layers", o.layers, 1, 64);
  o.norm_last_layer = c.optional<bool>("norm_last_layer", o.norm_last_layer);
  return o;
}

WeightNormLinear::WeightNormLinear(std::int64_t in, std::int64_t out, bool fixed_norm) {
  // torch.nn.Linear's initialisation for v (DINO applies its trunc_normal init before creating
  // the last layer), g = 1.
  auto init = refit::nn::Linear(in, out, /*with_bias=*/false).weight.detach().clone();
  weight_v = register_parameter("weight_v", init);
  if (fixed_norm) weight_g = register_buffer("weight_g", torch::ones({out, 1}));
  else
    weight_g = register_parameter("weight_g", torch::ones({out, 1}));
}

torch::Tensor WeightNormLinear::forward(const torch::Tensor& x) {
  // torch.nn.utils.weight_norm(dim=0): w = g * v / ||v|| with the norm over each output row.
  auto w = weight_v * (weight_g / weight_v.norm(2, /*dim=*/{1}, /*keepdim=*/true));
  return at::linear(x, w);
}

DinoHead::DinoHead(DinoHeadOptions options) : TensorModel("features", "logits"), options_(options) {
  auto mlp = register_module("mlp", torch::nn::Sequential());
  std::vector<std::int64_t> widths{options_.in_dim};
  for (std::int64_t i = 0; i + 1 < options_.layers; ++i) widths.push_back(options_.hidden_dim);
  widths.push_back(options_.bottleneck_dim);
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    auto linear = std::make_shared<refit::nn::Linear>(widths[i], widths[i + 1]);
    // DINO's _init_weights: trunc_normal_(std=.02) (bounds +-2, i.e. +-100 std: a normal), bias 0.
    {
      torch::NoGradGuard no_grad;
      linear->weight.normal_(0.0, 0.02);
      linear->bias.zero_();
    }
    linears_.push_back(linear);
    mlp->push_back(linear);
    if (i + 2 < widths.size()) mlp->push_back(torch::nn::GELU());
  }
  last_layer_ = register_module("last_layer", std::make_shared<WeightNormLinear>(options_.bottleneck_dim, options_.out_dim,
                                                                                 options_.norm_last_layer));
}

torch::Tensor DinoHead::forward(const torch::Tensor& input) {
  torch::Tensor x = input.flatten(1);
  for (std::size_t i = 0; i < linears_.size(); ++i) {
    x = linears_[i]->forward(x);
    if (i + 1 < linears_.size()) x = at::gelu(x);
  }
  // F.normalize(x, dim=-1, p=2): x / max(||x||, 1e-12), in fp32 (a norm in bf16 loses the
  // bottleneck's direction at these widths).
  auto xf = x.to(torch::kFloat);
  xf = xf / xf.norm(2, {-1}, true).clamp_min(1e-12);
  // Back to the layer's own dtype (bf16 under bf16-true; autocast casts anyway in mixed modes).
  return last_layer_->forward(xf.to(x.scalar_type()));
}

}  // namespace refit::dino
