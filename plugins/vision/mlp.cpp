#include "mlp.h"

#include <torch/nn/functional/activation.h>

#include "refit/recompute.h"

namespace refit::vision {

MlpOptions MlpOptions::from_config(const ConfigReader& c) {
  MlpOptions o;
  o.in_features = c.required<std::int64_t>("in_features");
  o.hidden = c.optional<std::vector<std::int64_t>>("hidden", {});
  o.out_features = c.required<std::int64_t>("out_features");
  o.activation = c.choice("activation", {"relu", "gelu", "tanh"}, o.activation);
  o.flatten = c.optional<bool>("flatten", true);
  o.dropout = c.number_in<double>("dropout", 0.0, 0.0, 1.0);
  if (c.has("in_features") && o.in_features <= 0) c.error("in_features", "expected a positive integer");
  if (c.has("out_features") && o.out_features <= 0) c.error("out_features", "expected a positive integer");
  for (std::size_t i = 0; i < o.hidden.size(); ++i)
    if (o.hidden[i] <= 0) c.error("hidden", "expected positive layer widths");
  return o;
}

Mlp::Mlp(MlpOptions options) : TensorModel("features", "output"), options_(std::move(options)) {
  std::vector<std::int64_t> widths{options_.in_features};
  widths.insert(widths.end(), options_.hidden.begin(), options_.hidden.end());
  widths.push_back(options_.out_features);
  layers_container_ = register_module("layers", torch::nn::ModuleList());
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    layers_.push_back(std::make_shared<refit::nn::Linear>(widths[i], widths[i + 1]));
    layers_container_->push_back(layers_.back());
  }
}

std::vector<std::string> Mlp::checkpointable_blocks() const {
  std::vector<std::string> blocks;
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) blocks.push_back("layers." + std::to_string(i));
  return blocks;
}

torch::Tensor Mlp::hidden_block(std::size_t i, const torch::Tensor& input) {
  torch::Tensor x = layers_[i]->forward(input);
  if (options_.activation == "relu") x = torch::relu(x);
  else if (options_.activation == "gelu")
    x = torch::gelu(x);
  else
    x = torch::tanh(x);
  if (options_.dropout > 0) x = torch::dropout(x, options_.dropout, is_training());
  return x;
}

torch::Tensor Mlp::forward(const torch::Tensor& input) {
  torch::Tensor x = options_.flatten ? input.flatten(1) : input;
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) {
    if (checkpointed("layers." + std::to_string(i)))
      x = recompute_in_backward(*layers_[i],
                                [this, i](const std::vector<torch::Tensor>& in) { return hidden_block(i, in[0]); }, {x});
    else
      x = hidden_block(i, x);
  }
  return layers_.back()->forward(x);
}

}  // namespace refit::vision
