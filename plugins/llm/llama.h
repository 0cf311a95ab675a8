#pragma once
// A Llama-architecture decoder language model ("llama", plugin "llm"): transformers'
// LlamaForCausalLM (modeling_llama.py) — also Qwen2 (q/k/v biases) and Mistral (sliding window)
// checkpoints — with transformers' parameter names, so that a model.safetensors loads with strict
// key matching and LoRA targets and PEFT files line up:
//
//   model.embed_tokens.weight                          [vocab, H]
//   model.layers.N.input_layernorm.weight              [H]
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight     [heads * d, H], [kv_heads * d, H] (k, v), [H, heads * d] (o)
//   model.layers.N.self_attn.{q,k,v}_proj.bias         (attention_bias, or Qwen2's qkv_bias)
//   model.layers.N.self_attn.o_proj.bias               (attention_bias)
//   model.layers.N.post_attention_layernorm.weight     [H]
//   model.layers.N.mlp.{gate,up}_proj.weight           [F, H]; mlp.down_proj.weight [H, F] (+ .bias: mlp_bias)
//   model.norm.weight                                  [H]
//   lm_head.weight                                     [vocab, H], only when not tie_word_embeddings
//
// Reads "input_ids" [B, T] and, as configured, "attention_mask" [B, T] (1 = token, 0 = padding,
// on either side) and "position_ids" [B, T]; returns "logits" [B, T, vocab], or with
// `output: "hidden_states"` the final normed states [B, T, H] and "lm_head_weight" [vocab, H]
// (the output projection's weight itself, so that a chunked cross-entropy never holds
// [tokens x vocab] logits). Every projection is an adaptable refit::nn::Linear; every decoder
// layer is a checkpointable block ("model.layers.N"). forward_step() decodes with a KV cache.
// See docs/models.md.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>

#include "refit/config.h"
#include "refit/layers.h"
#include "refit/model.h"

namespace refit::llm {

struct LlamaOptions {
  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads = 0;  // 0: num_attention_heads (no GQA)
  std::int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  std::int64_t max_position_embeddings = 2048;
  std::int64_t pad_token_id = -1;   // the embedding's padding_idx (its row gets no gradient); -1: none
  std::int64_t sliding_window = 0;  // Mistral: a key more than this many positions back is not seen; 0: none
  double rms_norm_eps = 1e-6;
  double attention_dropout = 0.0;
  double initializer_range = 0.02;
  // Rotary embeddings (transformers' rope_parameters).
  double rope_theta = 10000.0;
  std::string rope_type = "default";  // default | llama3
  double rope_factor = 8.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  std::int64_t rope_original_max_position_embeddings = 8192;
  bool attention_bias = false;  // biases on q, k, v and o (LlamaConfig.attention_bias)
  bool qkv_bias = false;        // biases on q, k, v only (Qwen2)
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  std::string output = "logits";  // logits | hidden_states
  bool read_attention_mask = true;
  bool read_position_ids = false;
  /// Packed sequences (lm_datasets.h, "packing"): reads "position_ids" (each sample's own
  /// positions) and "segment_ids" (the sample each token belongs to) and attends block-causally,
  /// a token seeing the earlier tokens of its own sample only.
  bool packed = false;
  /// What the source (config.json's model_type, a GGUF's general.architecture) calls the
  /// architecture: "llama", "qwen2" or "mistral"; the merged export's config.json says the same.
  std::string model_type = "llama";
  /// The special token ids the source declares (config.json, a GGUF's tokenizer.ggml.*), carried
  /// into an exported config.json; the model itself does not use them. -1 / empty: none.
  std::int64_t bos_token_id = -1;
  std::vector<std::int64_t> eos_token_ids;
  /// How the parameters start: transformers' initialisation, or nn::unloaded placeholders when
  /// a weights file follows (BuildContext::weights_follow): a 1B model is then built in no memory.
  nn::Init init = nn::Init::random;

  std::int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  std::int64_t dim_per_head() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }

  /// Reads the recipe's keys. "config_file" (a transformers config.json of a LlamaConfig,
  /// Qwen2Config or MistralConfig) or "gguf" (a GGUF file's `<arch>.*` metadata) supplies the
  /// architecture first; keys given beside it override.
  static LlamaOptions from_config(const ConfigReader& c);
};

/// transformers' config.json for these options (LlamaConfig, Qwen2Config or MistralConfig by
/// `model_type`, with `architectures` naming its ForCausalLM class), as JSON text: what
/// LlamaOptions::from_config reads back, and what from_pretrained reads beside a merged export.
std::string transformers_config_json(const LlamaOptions& o);

/// The rotary inverse frequencies [head_dim / 2], float32, as transformers computes them
/// (modeling_rope_utils: the default and the `llama3` rope types).
torch::Tensor rope_inverse_frequencies(const LlamaOptions& o);

/// Per-layer keys and values of the tokens seen so far, preallocated for `capacity` positions:
/// keys[l], values[l] are [B, kv_heads, capacity, head_dim] in the model's dtype. `length`
/// positions are filled (the same for every row: padding occupies slots, masked out by the
/// attention mask given to forward_step).
struct KVCache {
  std::vector<torch::Tensor> keys, values;
  std::int64_t length = 0;
  std::int64_t batch() const { return keys.empty() ? 0 : keys.front().size(0); }
  std::int64_t capacity() const { return keys.empty() ? 0 : keys.front().size(2); }
};

namespace llama {

/// transformers' LlamaRMSNorm: x / sqrt(mean(x^2) + eps) in float32, cast back to x's dtype, then
/// times the weight (in the dtype the two promote to).
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(std::int64_t size, double eps, nn::Init init = nn::Init::random);
  torch::Tensor forward(const torch::Tensor& x) const;
  torch::Tensor weight;
  double eps;
};

class Attention : public torch::nn::Module {
 public:
  explicit Attention(const LlamaOptions& o);
  /// `cos`, `sin`: [B, T, head_dim]; `mask`: [B, 1, T, S] bool (true: may attend), S = T without a
  /// cache, cache length + T with one. With `cache`, this step's keys and values are written at
  /// the cache's `length` and attention runs over the whole filled cache.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask, KVCache* cache = nullptr, std::size_t layer = 0);
  std::shared_ptr<refit::nn::Linear> q_proj, k_proj, v_proj, o_proj;

 private:
  std::int64_t heads_, kv_heads_, head_dim_;
  double dropout_;
};

class MLP : public torch::nn::Module {
 public:
  explicit MLP(const LlamaOptions& o);
  torch::Tensor forward(const torch::Tensor& x);
  std::shared_ptr<refit::nn::Linear> gate_proj, up_proj, down_proj;
};

class DecoderLayer : public torch::nn::Module {
 public:
  explicit DecoderLayer(const LlamaOptions& o);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask, KVCache* cache = nullptr, std::size_t layer = 0);
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<MLP> mlp;
};

/// transformers' LlamaModel: embeddings, the decoder layers, the final norm.
class Decoder : public torch::nn::Module {
 public:
  explicit Decoder(const LlamaOptions& o);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::shared_ptr<RMSNorm> norm;
  std::vector<std::shared_ptr<DecoderLayer>> layer_list;
};

}  // namespace llama

class Llama : public Model {
 public:
  explicit Llama(LlamaOptions options);
  std::vector<std::string> input_fields() const override;
  std::vector<std::string> output_fields() const override;
  Fields forward_fields(const Fields& inputs) override;
  /// "model.layers.<i>": each decoder layer.
  std::vector<std::string> checkpointable_blocks() const override;
  /// forward_step() behind the SDK's interface, for refit generate.
  IncrementalDecoder* decoder() override;
  /// transformers_config_json(options()).
  std::string reference_config() const override;
  /// An untied lm_head stays dense under a quantized storage (as transformers keeps it).
  std::vector<std::string> dense_layers() const override;
  const LlamaOptions& options() const { return options_; }

  /// The final normed hidden states [B, T, H] of a whole sequence. `attention_mask` [B, T] and
  /// `position_ids` [B, T] may be undefined (no padding; positions: derived from the mask as
  /// transformers' generate does — cumsum - 1, padding at 1 — or 0..T-1 without one).
  /// `segment_ids` [B, T] (packed samples, 1, 2, ...): a token attends within its segment only.
  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const torch::Tensor& position_ids, const torch::Tensor& segment_ids = {});
  /// The output projection's weight [vocab, H]: lm_head's, or the embedding's when tied.
  torch::Tensor lm_head_weight() const;
  /// hidden states -> logits (lm_head, or the tied embedding).
  torch::Tensor logits(const torch::Tensor& hidden_states);

  /// An empty cache for `batch` rows and `capacity` positions, on the model's device, in its dtype.
  KVCache make_cache(std::int64_t batch, std::int64_t capacity) const;
  /// Runs `input_ids` [B, S] (a prompt, or one new token per row) after the cache's `length`
  /// positions, appends their keys and values to the cache and returns the logits of the last
  /// position [B, vocab]. `attention_mask` [B, length + S] covers every slot so far (1: a token,
  /// 0: padding), as transformers' generate passes it; undefined: all tokens. `positions` [B, S]
  /// undefined: derived from the mask (cumsum - 1, padding at 1), or length + 0..S-1.
  torch::Tensor forward_step(const torch::Tensor& input_ids, const torch::Tensor& positions, KVCache& cache,
                             const torch::Tensor& attention_mask = {});

  std::shared_ptr<llama::Decoder> model;
  std::shared_ptr<refit::nn::Linear> lm_head;  // null when tied

 private:
  /// Runs the layers on embedded `x` with rotary tables for `positions` and the boolean `mask`.
  torch::Tensor run_layers(torch::Tensor x, const torch::Tensor& positions, const torch::Tensor& mask, KVCache* cache);
  torch::Tensor inverse_frequencies(const c10::Device& device);
  LlamaOptions options_;
  std::unique_ptr<IncrementalDecoder> decoder_;
  torch::Tensor inv_freq_;  // float32 [head_dim / 2] on the CPU; not a buffer (transformers' is not saved)
  torch::Tensor inv_freq_device_;
};

/// Greedy decoding of `max_new_tokens` tokens per row with a KV cache: `prompt_ids` [B, P]
/// (left-padded when lengths differ) with `prompt_mask` [B, P] (undefined: no padding). A row
/// that has produced `eos_token_id` (>= 0) continues with `pad_token_id`, as transformers'
/// generate does. Returns [B, max_new_tokens] int64.
torch::Tensor greedy_generate(Llama& model, const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                              std::int64_t max_new_tokens, std::int64_t eos_token_id = -1, std::int64_t pad_token_id = 0);

/// The same without a cache: each step recomputes the whole sequence (the reference for the
/// cache's test, and for nothing else: it is quadratic).
torch::Tensor greedy_generate_uncached(Llama& model, const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                       std::int64_t max_new_tokens, std::int64_t eos_token_id = -1,
                                       std::int64_t pad_token_id = 0);

}  // namespace refit::llm
