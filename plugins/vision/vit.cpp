#include "vit.h"

#include <cmath>
#include <utility>

#include <ATen/ops/_upsample_bicubic2d_aa.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/upsample_bicubic2d.h>

#include "refit/error.h"
#include "refit/recompute.h"

namespace refit::vision {

VitOptions VitOptions::from_config(const ConfigReader& c) {
  VitOptions o;
  o.image_size = c.number_in<std::int64_t>("image_size", o.image_size, 1, 16384);
  o.patch_size = c.number_in<std::int64_t>("patch_size", o.patch_size, 1, 16384);
  o.num_channels = c.number_in<std::int64_t>("num_channels", o.num_channels, 1, 4096);
  o.hidden_size = c.number_in<std::int64_t>("hidden_size", o.hidden_size, 1, 65536);
  o.num_hidden_layers = c.number_in<std::int64_t>("num_hidden_layers", o.num_hidden_layers, 1, 1024);
  o.num_attention_heads = c.number_in<std::int64_t>("num_attention_heads", o.num_attention_heads, 1, 4096);
  o.mlp_ratio = c.number_in<double>("mlp_ratio", o.mlp_ratio, 0.0, 64.0);
  o.layerscale_value = c.number_in<double>("layerscale_value", o.layerscale_value, -1e6, 1e6);
  o.layer_norm_eps = c.number_in<double>("layer_norm_eps", o.layer_norm_eps, 0.0, 1.0);
  o.num_register_tokens = c.number_in<std::int64_t>("num_register_tokens", o.num_register_tokens, 0, 1024);
  o.qkv_bias = c.optional<bool>("qkv_bias", o.qkv_bias);
  o.use_mask_token = c.optional<bool>("use_mask_token", o.use_mask_token);
  o.initializer_range = c.number_in<double>("initializer_range", o.initializer_range, 0.0, 10.0);
  o.output = c.choice("output", {"cls", "cls_mean", "tokens"}, o.output);
  if (o.patch_size > o.image_size)
    c.error("patch_size",
            "expected at most image_size (" + std::to_string(o.image_size) + "), got " + std::to_string(o.patch_size));
  if (o.hidden_size % o.num_attention_heads != 0)
    c.error("num_attention_heads", "expected a divisor of hidden_size (" + std::to_string(o.hidden_size) + "), got " +
                                       std::to_string(o.num_attention_heads));
  if (o.mlp_hidden() < 1) c.error("mlp_ratio", "hidden_size * mlp_ratio must be at least 1");
  if (o.layer_norm_eps <= 0) c.error("layer_norm_eps", "expected a positive value");
  return o;
}

namespace vit {
namespace {

/// transformers' trunc_normal_(std=initializer_range, a=-2, b=2): at these std the truncation
/// at +-2 never bites, a clamp is the same distribution.
void trunc_normal_(torch::Tensor& t, double std) {
  torch::NoGradGuard ng;
  t.normal_(0.0, std).clamp_(-2.0, 2.0);
}

/// transformers' Dinov2 init for Linear / Conv2d: truncated normal weight, zero bias.
template <class L>
std::shared_ptr<L> init_layer(std::shared_ptr<L> layer, double std) {
  trunc_normal_(layer->weight, std);
  if (layer->bias.defined()) {
    torch::NoGradGuard ng;
    layer->bias.zero_();
  }
  return layer;
}

torch::nn::LayerNorm layer_norm(const VitOptions& o) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden_size}).eps(o.layer_norm_eps));
}

}  // namespace

LayerScale::LayerScale(std::int64_t dim, double init) { lambda1 = register_parameter("lambda1", torch::full({dim}, init)); }

PatchEmbeddings::PatchEmbeddings(const VitOptions& o) {
  refit::nn::Conv2dOptions c;
  c.in_channels = o.num_channels, c.out_channels = o.hidden_size;
  c.kernel_size = {o.patch_size, o.patch_size}, c.stride = {o.patch_size, o.patch_size};
  projection = register_module("projection", init_layer(std::make_shared<refit::nn::Conv2d>(c), o.initializer_range));
}

torch::Tensor PatchEmbeddings::forward(const torch::Tensor& pixel_values) {
  // transformers casts the pixels to the projection's dtype (a bf16 backbone gets bf16 pixels).
  return projection->forward(pixel_values.to(projection->weight.scalar_type())).flatten(2).transpose(1, 2);
}

Embeddings::Embeddings(const VitOptions& o) : patch_size_(o.patch_size), num_register_tokens_(o.num_register_tokens) {
  cls_token = register_parameter("cls_token", torch::empty({1, 1, o.hidden_size}));
  trunc_normal_(cls_token, o.initializer_range);
  if (o.use_mask_token) mask_token = register_parameter("mask_token", torch::zeros({1, o.hidden_size}));
  patch_embeddings = register_module("patch_embeddings", std::make_shared<PatchEmbeddings>(o));
  position_embeddings = register_parameter("position_embeddings", torch::empty({1, o.grid() * o.grid() + 1, o.hidden_size}));
  trunc_normal_(position_embeddings, o.initializer_range);
  if (o.num_register_tokens > 0)
    register_tokens = register_parameter("register_tokens", torch::zeros({1, o.num_register_tokens, o.hidden_size}));
}

torch::Tensor Embeddings::interpolate_pos_encoding(std::int64_t num_patches, std::int64_t height, std::int64_t width) const {
  // Op for op transformers' Dinov2Embeddings / Dinov2WithRegistersEmbeddings.interpolate_pos_encoding.
  const std::int64_t num_positions = position_embeddings.size(1) - 1;
  if (num_patches == num_positions && height == width) return position_embeddings;
  const torch::Tensor class_pos_embed = position_embeddings.slice(1, 0, 1);
  torch::Tensor patch_pos_embed = position_embeddings.slice(1, 1);
  const std::int64_t dim = position_embeddings.size(-1);
  const std::int64_t new_height = height / patch_size_, new_width = width / patch_size_;
  const auto sqrt_num_positions = static_cast<std::int64_t>(std::pow(static_cast<double>(num_positions), 0.5));
  patch_pos_embed = patch_pos_embed.reshape({1, sqrt_num_positions, sqrt_num_positions, dim}).permute({0, 3, 1, 2});
  // Interpolated in float32 (bicubic in half precision shifts the embeddings), then cast back.
  const auto target_dtype = patch_pos_embed.scalar_type();
  const torch::Tensor f32 = patch_pos_embed.to(torch::kFloat32);
  // Dinov2Model: plain bicubic; Dinov2WithRegistersModel: antialiased bicubic (a different kernel
  // even when upsampling). Both by output size, align_corners = false.
  patch_pos_embed = num_register_tokens_ > 0
                        ? at::_upsample_bicubic2d_aa(f32, {new_height, new_width}, false, std::nullopt, std::nullopt)
                        : at::upsample_bicubic2d(f32, {new_height, new_width}, false, std::nullopt, std::nullopt);
  patch_pos_embed = patch_pos_embed.to(target_dtype).permute({0, 2, 3, 1}).view({1, -1, dim});
  return at::cat({class_pos_embed, patch_pos_embed}, 1);
}

torch::Tensor Embeddings::forward(const torch::Tensor& pixel_values) {
  const std::int64_t batch = pixel_values.size(0), height = pixel_values.size(2), width = pixel_values.size(3);
  torch::Tensor embeddings = patch_embeddings->forward(pixel_values);
  embeddings = at::cat({cls_token.expand({batch, -1, -1}), embeddings}, 1);
  embeddings = embeddings + interpolate_pos_encoding(embeddings.size(1) - 1, height, width);
  if (num_register_tokens_ > 0)
    embeddings = at::cat({embeddings.slice(1, 0, 1), register_tokens.expand({batch, -1, -1}), embeddings.slice(1, 1)}, 1);
  return embeddings;
}

SelfAttention::SelfAttention(const VitOptions& o) {
  const double s = o.initializer_range;
  query =
      register_module("query", init_layer(std::make_shared<refit::nn::Linear>(o.hidden_size, o.hidden_size, o.qkv_bias), s));
  key = register_module("key", init_layer(std::make_shared<refit::nn::Linear>(o.hidden_size, o.hidden_size, o.qkv_bias), s));
  value =
      register_module("value", init_layer(std::make_shared<refit::nn::Linear>(o.hidden_size, o.hidden_size, o.qkv_bias), s));
}

SelfOutput::SelfOutput(const VitOptions& o) {
  dense = register_module("dense", init_layer(std::make_shared<refit::nn::Linear>(o.hidden_size, o.hidden_size),
                                              o.initializer_range));
}

Attention::Attention(const VitOptions& o) : heads_(o.num_attention_heads), head_dim_(o.hidden_size / o.num_attention_heads) {
  attention = register_module("attention", std::make_shared<SelfAttention>(o));
  output = register_module("output", std::make_shared<SelfOutput>(o));
}

torch::Tensor Attention::forward(const torch::Tensor& x) {
  const std::int64_t batch = x.size(0), tokens = x.size(1);
  auto heads = [&](const torch::Tensor& t) { return t.view({batch, tokens, -1, head_dim_}).transpose(1, 2); };
  const torch::Tensor q = heads(attention->query->forward(x));
  const torch::Tensor k = heads(attention->key->forward(x));
  const torch::Tensor v = heads(attention->value->forward(x));
  // Dropout-free, unmasked, scale head_dim^-0.5: what transformers passes to SDPA.
  torch::Tensor o =
      at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, false, std::pow(static_cast<double>(head_dim_), -0.5));
  o = o.transpose(1, 2).contiguous().reshape({batch, tokens, -1}).contiguous();
  return output->dense->forward(o);
}

Mlp::Mlp(const VitOptions& o) {
  fc1 = register_module("fc1",
                        init_layer(std::make_shared<refit::nn::Linear>(o.hidden_size, o.mlp_hidden()), o.initializer_range));
  fc2 = register_module("fc2",
                        init_layer(std::make_shared<refit::nn::Linear>(o.mlp_hidden(), o.hidden_size), o.initializer_range));
}

torch::Tensor Mlp::forward(const torch::Tensor& x) { return fc2->forward(at::gelu(fc1->forward(x))); }

Layer::Layer(const VitOptions& o) {
  norm1 = register_module("norm1", layer_norm(o));
  attention = register_module("attention", std::make_shared<Attention>(o));
  layer_scale1 = register_module("layer_scale1", std::make_shared<LayerScale>(o.hidden_size, o.layerscale_value));
  norm2 = register_module("norm2", layer_norm(o));
  mlp = register_module("mlp", std::make_shared<Mlp>(o));
  layer_scale2 = register_module("layer_scale2", std::make_shared<LayerScale>(o.hidden_size, o.layerscale_value));
}

torch::Tensor Layer::forward(const torch::Tensor& x) {
  torch::Tensor h = layer_scale1->forward(attention->forward(norm1(x))) + x;
  return layer_scale2->forward(mlp->forward(norm2(h))) + h;
}

Encoder::Encoder(const VitOptions& o) {
  layer = register_module("layer", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < o.num_hidden_layers; ++i) {
    layers_.push_back(std::make_shared<Layer>(o));
    layer->push_back(layers_.back());
  }
}

torch::Tensor Encoder::forward(torch::Tensor x, const std::vector<bool>& recompute) {
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const auto& l = layers_[i];
    if (i < recompute.size() && recompute[i])
      x = recompute_in_backward(*l, [l](const std::vector<torch::Tensor>& in) { return l->forward(in[0]); }, {x});
    else
      x = l->forward(x);
  }
  return x;
}

}  // namespace vit

Vit::Vit(VitOptions options) : TensorModel("pixel_values", "features"), options_(std::move(options)) {
  embeddings = register_module("embeddings", std::make_shared<vit::Embeddings>(options_));
  encoder = register_module("encoder", std::make_shared<vit::Encoder>(options_));
  layernorm = register_module("layernorm", vit::layer_norm(options_));
}

std::vector<ModuleRename> Vit::module_renames() const {
  return {{"attention.attention.query", "attention.q_proj"},
          {"attention.attention.key", "attention.k_proj"},
          {"attention.attention.value", "attention.v_proj"},
          {"attention.output.dense", "attention.o_proj"}};
}

torch::Tensor Vit::forward_tokens(const torch::Tensor& pixel_values) {
  if (pixel_values.dim() != 4 || pixel_values.size(1) != options_.num_channels)
    throw Error("vit: expected pixel values [batch, " + std::to_string(options_.num_channels) + ", height, width], got " +
                c10::str(pixel_values.sizes()));
  if (pixel_values.size(2) < options_.patch_size || pixel_values.size(3) < options_.patch_size)
    throw Error("vit: the image (" + c10::str(pixel_values.sizes()) + ") is smaller than one patch (" +
                std::to_string(options_.patch_size) + ")");
  std::vector<bool> recompute(encoder->size());
  for (std::size_t i = 0; i < recompute.size(); ++i) recompute[i] = checkpointed("encoder.layer." + std::to_string(i));
  return layernorm(encoder->forward(embeddings->forward(pixel_values), recompute));
}

torch::Tensor Vit::features_of(const torch::Tensor& tokens) const {
  if (options_.output == "tokens") return tokens;
  torch::Tensor cls = tokens.select(1, 0);
  if (options_.output == "cls") return cls;
  // cls_mean: [CLS, mean of the patch tokens] (registers excluded), Dinov2ForImageClassification's input.
  return at::cat({cls, tokens.slice(1, 1 + options_.num_register_tokens).mean(1)}, 1);
}

std::vector<std::string> Vit::checkpointable_blocks() const {
  std::vector<std::string> blocks;
  for (std::size_t i = 0; i < encoder->size(); ++i) blocks.push_back("encoder.layer." + std::to_string(i));
  return blocks;
}

torch::Tensor Vit::forward(const torch::Tensor& pixel_values) { return features_of(forward_tokens(pixel_values)); }

Fields Vit::forward_fields(const Fields& inputs) {
  torch::Tensor tokens = forward_tokens(inputs.at("pixel_values"));
  return Fields{{"features", features_of(tokens)}, {"last_hidden_state", tokens}};
}

LinearHeadOptions LinearHeadOptions::from_config(const ConfigReader& c) {
  LinearHeadOptions o;
  o.in_features = c.required<std::int64_t>("in_features");
  o.out_features = c.required<std::int64_t>("out_features");
  o.bias = c.optional<bool>("bias", o.bias);
  if (c.has("in_features") && (o.in_features < 1 || o.in_features > (std::int64_t{1} << 24)))
    c.error("in_features", "expected a value in [1, 16777216], got " + std::to_string(o.in_features));
  if (c.has("out_features") && (o.out_features < 1 || o.out_features > (std::int64_t{1} << 24)))
    c.error("out_features", "expected a value in [1, 16777216], got " + std::to_string(o.out_features));
  return o;
}

LinearHead::LinearHead(LinearHeadOptions options) : TensorModel("features", "logits"), options_(options) {
  linear = register_module("linear",
                           std::make_shared<refit::nn::Linear>(options_.in_features, options_.out_features, options_.bias));
}

torch::Tensor LinearHead::forward(const torch::Tensor& input) {
  if (input.dim() < 1 || input.size(-1) != options_.in_features)
    throw Error("linear_head: expected features [..., " + std::to_string(options_.in_features) + "], got " +
                c10::str(input.sizes()));
  return linear->forward(input);
}

}  // namespace refit::vision
