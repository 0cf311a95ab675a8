#pragma once
// A BERT-family text encoder ("bert"): transformers' BertModel architecture (absolute
// positions, post-LayerNorm, GELU), with transformers' parameter names, so that a BertModel's
// model.safetensors — e.g. sentence-transformers' all-MiniLM-L6-v2 — loads with strict key
// matching, the position-id buffer included:
//
//   embeddings.word_embeddings.weight          [vocab, D]
//   embeddings.position_embeddings.weight      [max_positions, D]
//   embeddings.token_type_embeddings.weight    [type_vocab, D]
//   embeddings.LayerNorm.{weight,bias}
//   embeddings.position_ids                    [1, max_positions] int64 (buffer)
//   encoder.layer.N.attention.self.{query,key,value}.{weight,bias}
//   encoder.layer.N.attention.output.dense.{weight,bias}
//   encoder.layer.N.attention.output.LayerNorm.{weight,bias}
//   encoder.layer.N.intermediate.dense.{weight,bias}
//   encoder.layer.N.output.dense.{weight,bias}
//   encoder.layer.N.output.LayerNorm.{weight,bias}
//   pooler.dense.{weight,bias}                 (add_pooling_layer)
//
// Reads "input_ids", "attention_mask" and "token_type_ids" ([B, T]); returns "features" (the
// main output: sentence-transformers' masked mean or max pooling, or the CLS token, or the
// pooler output — `output` — optionally L2-normalised; without them in the recipe, what the
// config file's sentence-transformers folder declares, text/declared_pooling.h),
// "last_hidden_state" [B, T, D] and, with the pooler,
// "pooler_output" [B, D]. Every Linear is an adaptable refit::nn::Linear (LoRA targets such as
// "encoder\\.layer\\.[0-9]+\\.attention\\.self\\.(query|value)"). See docs/text.md.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include "refit/config.h"
#include "refit/layers.h"
#include "refit/model.h"

namespace refit::text {

struct BertOptions {
  std::int64_t vocab_size = 30522;
  std::int64_t hidden_size = 768;
  std::int64_t num_hidden_layers = 12;
  std::int64_t num_attention_heads = 12;
  std::int64_t intermediate_size = 3072;
  std::int64_t max_position_embeddings = 512;
  std::int64_t type_vocab_size = 2;
  std::int64_t pad_token_id = 0;
  double layer_norm_eps = 1e-12;
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double initializer_range = 0.02;
  bool add_pooling_layer = true;
  std::string output = "mean";  // mean | cls | max | pooler
  bool normalize = false;       // L2-normalise "features" (sentence-transformers' Normalize module)
  /// Where output and normalize came from, for the run header: "the recipe", a file of the
  /// config file's folder ("1_Pooling/config.json pooling_mode_mean_tokens", "modules.json
  /// Normalize"), or "the default".
  std::string output_from = "the default", normalize_from = "the default";

  /// Reads the keys above; "config_file" (a transformers config.json) supplies the architecture
  /// keys first, and keys given beside it override them. Without "output" / "normalize", a
  /// sentence-transformers folder around the config file supplies them (text/declared_pooling.h).
  static BertOptions from_config(const ConfigReader& c);
};

namespace bert {

class Embeddings : public torch::nn::Module {
 public:
  explicit Embeddings(const BertOptions& o);
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids);
  torch::nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};
  torch::Tensor position_ids;
  double dropout_p;
};

class SelfAttention : public torch::nn::Module {
 public:
  explicit SelfAttention(const BertOptions& o);
  std::shared_ptr<refit::nn::Linear> query, key, value;
};

/// The attention's output projection, dropout and residual LayerNorm (transformers' BertSelfOutput).
class SelfOutput : public torch::nn::Module {
 public:
  explicit SelfOutput(const BertOptions& o);
  std::shared_ptr<refit::nn::Linear> dense;
  torch::nn::LayerNorm LayerNorm{nullptr};
};

class Attention : public torch::nn::Module {
 public:
  explicit Attention(const BertOptions& o);
  /// `mask`: [B, 1, 1, T] bool, true where a key may be attended to.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  std::shared_ptr<SelfAttention> self;
  std::shared_ptr<SelfOutput> output;

 private:
  std::int64_t heads_, head_dim_;
  double dropout_, hidden_dropout_;
};

class Intermediate : public torch::nn::Module {
 public:
  explicit Intermediate(const BertOptions& o);
  std::shared_ptr<refit::nn::Linear> dense;
};

/// The feed-forward's output projection, dropout and residual LayerNorm (BertOutput).
class Output : public torch::nn::Module {
 public:
  explicit Output(const BertOptions& o);
  std::shared_ptr<refit::nn::Linear> dense;
  torch::nn::LayerNorm LayerNorm{nullptr};
};

class Layer : public torch::nn::Module {
 public:
  explicit Layer(const BertOptions& o);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  std::shared_ptr<Attention> attention;
  std::shared_ptr<Intermediate> intermediate;
  std::shared_ptr<Output> output;

 private:
  double dropout_;
};

class Encoder : public torch::nn::Module {
 public:
  explicit Encoder(const BertOptions& o);
  /// `recompute[i]`: layer i's activations are recomputed in the backward (refit/recompute.h).
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask, const std::vector<bool>& recompute = {});
  std::size_t size() const { return layers_.size(); }
  torch::nn::ModuleList layer{nullptr};

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
};

class Pooler : public torch::nn::Module {
 public:
  explicit Pooler(const BertOptions& o);
  std::shared_ptr<refit::nn::Linear> dense;
};

}  // namespace bert

class Bert : public Model {
 public:
  explicit Bert(BertOptions options);
  std::vector<std::string> input_fields() const override { return {"input_ids", "attention_mask", "token_type_ids"}; }
  std::vector<std::string> output_fields() const override;
  Fields forward_fields(const Fields& inputs) override;
  /// transformers 5 registers the position ids with persistent=False: its files lack them.
  std::vector<std::string> non_persistent_buffers() const override { return {"embeddings.position_ids"}; }
  /// "encoder.layer.<i>": each transformer layer.
  std::vector<std::string> checkpointable_blocks() const override;
  /// "bert, 6 layers, hidden 384, features mean (1_Pooling/config.json pooling_mode_mean_tokens),
  /// normalize true (modules.json Normalize)": the pooling and where it came from.
  std::string describe() const override;
  const BertOptions& options() const { return options_; }

  std::shared_ptr<bert::Embeddings> embeddings;
  std::shared_ptr<bert::Encoder> encoder;
  std::shared_ptr<bert::Pooler> pooler;  // null without add_pooling_layer

 private:
  BertOptions options_;
};

/// sentence-transformers' mean pooling: the mean of the token states where `attention_mask` is
/// 1 (sum / max(count, 1e-9)), in float32.
torch::Tensor masked_mean(const torch::Tensor& states, const torch::Tensor& attention_mask);

/// sentence-transformers' max pooling: the largest token state per feature where
/// `attention_mask` is 1 (padding set to -1e9 first), in float32.
torch::Tensor masked_max(const torch::Tensor& states, const torch::Tensor& attention_mask);

}  // namespace refit::text
