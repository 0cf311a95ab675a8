#pragma once
// A Vision Transformer with the DINOv2 architecture ("vit"), and a linear classification head
// ("linear_head") to chain after it.
//
// Module and parameter paths are those of HF transformers' Dinov2Model (num_register_tokens = 0)
// and Dinov2WithRegistersModel (num_register_tokens > 0) in their checkpoint files — the
// published facebook/dinov2-* model.safetensors load with strict key matching:
//
//   embeddings.cls_token                 [1, 1, D]
//   embeddings.mask_token                [1, D]        (use_mask_token; unused by forward)
//   embeddings.register_tokens           [1, R, D]     (num_register_tokens R > 0)
//   embeddings.position_embeddings       [1, 1 + (image_size / patch_size)^2, D]
//   embeddings.patch_embeddings.projection.{weight,bias}         Conv2d, kernel = stride = patch
//   encoder.layer.N.norm1.{weight,bias}
//   encoder.layer.N.attention.attention.{query,key,value}.{weight,bias}   (bias: qkv_bias)
//   encoder.layer.N.attention.output.dense.{weight,bias}
//   encoder.layer.N.layer_scale1.lambda1
//   encoder.layer.N.norm2.{weight,bias}
//   encoder.layer.N.mlp.fc1.{weight,bias}, encoder.layer.N.mlp.fc2.{weight,bias}
//   encoder.layer.N.layer_scale2.lambda1
//   layernorm.{weight,bias}
//
// Every Linear / Conv2d is an adaptable refit::nn layer (LoRA targets such as
// "encoder\\.layer\\.[0-9]+\\.attention\\.attention\\.(query|value)"). See docs/models.md.
//
// transformers >= 5 names the attention projections differently in memory
// (attention.q_proj / k_proj / v_proj / o_proj); Vit lists them (refit/module_names.h), so that
// PEFT adapters are written with the names PEFT finds on a transformers Dinov2Model.
#include <cstdint>
#include <memory>
#include <string>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/normalization.h>

#include "refit/config.h"
#include "refit/layers.h"
#include "refit/model.h"
#include "refit/module_names.h"

namespace refit::vision {

struct VitOptions {
  std::int64_t image_size = 224;  // the size the position embeddings were trained for (square)
  std::int64_t patch_size = 14;
  std::int64_t num_channels = 3;
  std::int64_t hidden_size = 768;
  std::int64_t num_hidden_layers = 12;
  std::int64_t num_attention_heads = 12;
  double mlp_ratio = 4.0;  // MLP width = int(hidden_size * mlp_ratio), as transformers
  double layerscale_value = 1.0;
  double layer_norm_eps = 1e-6;
  std::int64_t num_register_tokens = 0;
  bool qkv_bias = true;
  bool use_mask_token = true;
  double initializer_range = 0.02;
  std::string output = "cls";  // cls | cls_mean | tokens

  std::int64_t grid() const { return image_size / patch_size; }
  std::int64_t mlp_hidden() const { return static_cast<std::int64_t>(static_cast<double>(hidden_size) * mlp_ratio); }
  /// The width of forward's output: hidden_size, or 2 * hidden_size for "cls_mean".
  std::int64_t output_features() const { return output == "cls_mean" ? 2 * hidden_size : hidden_size; }

  static VitOptions from_config(const ConfigReader& c);
};

namespace vit {

/// x * lambda1 (per channel).
class LayerScale : public torch::nn::Module {
 public:
  LayerScale(std::int64_t dim, double init);
  torch::Tensor forward(const torch::Tensor& x) { return x * lambda1; }
  torch::Tensor lambda1;
};

class PatchEmbeddings : public torch::nn::Module {
 public:
  explicit PatchEmbeddings(const VitOptions& o);
  /// [B, C, H, W] -> [B, (H / p) * (W / p), D] (a remainder smaller than a patch is dropped).
  torch::Tensor forward(const torch::Tensor& pixel_values);
  std::shared_ptr<refit::nn::Conv2d> projection;
};

class Embeddings : public torch::nn::Module {
 public:
  explicit Embeddings(const VitOptions& o);
  /// [CLS, registers..., patches...] with position embeddings added (not to the registers).
  torch::Tensor forward(const torch::Tensor& pixel_values);
  /// The position embeddings for a `height` x `width` input, as transformers' interpolate_pos_encoding.
  torch::Tensor interpolate_pos_encoding(std::int64_t num_patches, std::int64_t height, std::int64_t width) const;

  torch::Tensor cls_token, mask_token, register_tokens, position_embeddings;
  std::shared_ptr<PatchEmbeddings> patch_embeddings;

 private:
  std::int64_t patch_size_, num_register_tokens_;
};

/// "attention.attention": the q/k/v projections.
class SelfAttention : public torch::nn::Module {
 public:
  explicit SelfAttention(const VitOptions& o);
  std::shared_ptr<refit::nn::Linear> query, key, value;
};

/// "attention.output": the output projection.
class SelfOutput : public torch::nn::Module {
 public:
  explicit SelfOutput(const VitOptions& o);
  std::shared_ptr<refit::nn::Linear> dense;
};

class Attention : public torch::nn::Module {
 public:
  explicit Attention(const VitOptions& o);
  torch::Tensor forward(const torch::Tensor& x);
  std::shared_ptr<SelfAttention> attention;
  std::shared_ptr<SelfOutput> output;

 private:
  std::int64_t heads_, head_dim_;
};

class Mlp : public torch::nn::Module {
 public:
  explicit Mlp(const VitOptions& o);
  torch::Tensor forward(const torch::Tensor& x);
  std::shared_ptr<refit::nn::Linear> fc1, fc2;
};

/// Pre-norm block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x))).
class Layer : public torch::nn::Module {
 public:
  explicit Layer(const VitOptions& o);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  std::shared_ptr<Attention> attention;
  std::shared_ptr<LayerScale> layer_scale1, layer_scale2;
  std::shared_ptr<Mlp> mlp;
};

class Encoder : public torch::nn::Module {
 public:
  explicit Encoder(const VitOptions& o);
  /// `recompute[i]`: layer i's activations are recomputed in the backward (refit/recompute.h).
  torch::Tensor forward(torch::Tensor x, const std::vector<bool>& recompute = {});
  std::size_t size() const { return layers_.size(); }
  torch::nn::ModuleList layer{nullptr};

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
};

}  // namespace vit

/// Reads "pixel_values"; outputs "features" (main: per options.output) and "last_hidden_state".
class Vit : public TensorModel {
 public:
  explicit Vit(VitOptions options);
  /// transformers' in-memory names of the attention projections (Dinov2Model and
  /// Dinov2WithRegistersModel, transformers >= 5).
  std::vector<ModuleRename> module_renames() const override;
  /// "encoder.layer.<i>": each transformer layer.
  std::vector<std::string> checkpointable_blocks() const override;
  /// pixel_values [B, C, H, W] -> features per options.output.
  torch::Tensor forward(const torch::Tensor& pixel_values) override;
  std::vector<std::string> output_fields() const override { return {"features", "last_hidden_state"}; }
  Fields forward_fields(const Fields& inputs) override;
  /// The final-layernormed sequence [B, 1 + R + N, D] (transformers' last_hidden_state).
  torch::Tensor forward_tokens(const torch::Tensor& pixel_values);
  const VitOptions& options() const { return options_; }
  /// The main output ("features") of a last_hidden_state, per options.output.
  torch::Tensor features_of(const torch::Tensor& tokens) const;

  std::shared_ptr<vit::Embeddings> embeddings;
  std::shared_ptr<vit::Encoder> encoder;
  torch::nn::LayerNorm layernorm{nullptr};

 private:
  VitOptions options_;
};

struct LinearHeadOptions {
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  bool bias = true;
  static LinearHeadOptions from_config(const ConfigReader& c);
};

/// y = x W^T + b over the last dimension; parameters "linear.weight" / "linear.bias". Reads
/// "features", outputs "logits".
class LinearHead : public TensorModel {
 public:
  explicit LinearHead(LinearHeadOptions options);
  torch::Tensor forward(const torch::Tensor& input) override;
  std::shared_ptr<refit::nn::Linear> linear;

 private:
  LinearHeadOptions options_;
};

}  // namespace refit::vision
