#include "bert.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "refit/error.h"
#include "refit/recompute.h"
#include "text/declared_pooling.h"
#include "text/dropout.h"

namespace refit::text {

namespace {

/// The architecture keys of a BertConfig, with their ranges: read from a config.json first, then
/// from the recipe (which overrides), and every value checked whatever its source.
struct IntKey {
  const char* key;
  std::int64_t BertOptions::*field;
  std::int64_t lo, hi;
};
struct RealKey {
  const char* key;
  double BertOptions::*field;
  double lo, hi;
};
constexpr IntKey kIntKeys[] = {{"vocab_size", &BertOptions::vocab_size, 1, std::int64_t{1} << 24},
                               {"hidden_size", &BertOptions::hidden_size, 1, 65536},
                               {"num_hidden_layers", &BertOptions::num_hidden_layers, 1, 1024},
                               {"num_attention_heads", &BertOptions::num_attention_heads, 1, 4096},
                               {"intermediate_size", &BertOptions::intermediate_size, 1, 1 << 20},
                               {"max_position_embeddings", &BertOptions::max_position_embeddings, 1, 1 << 20},
                               {"type_vocab_size", &BertOptions::type_vocab_size, 1, 1024},
                               {"pad_token_id", &BertOptions::pad_token_id, 0, std::int64_t{1} << 24}};
constexpr RealKey kRealKeys[] = {{"layer_norm_eps", &BertOptions::layer_norm_eps, 0.0, 1.0},
                                 {"hidden_dropout_prob", &BertOptions::hidden_dropout_prob, 0.0, 1.0},
                                 {"attention_probs_dropout_prob", &BertOptions::attention_probs_dropout_prob, 0.0, 1.0},
                                 {"initializer_range", &BertOptions::initializer_range, 0.0, 10.0}};

/// The architecture keys of a transformers config.json, into `o`; values out of range or of the
/// wrong type are reported at "config_file".
void read_config_json(const nlohmann::json& j, BertOptions& o, const ConfigReader& c) {
  auto bad = [&](const char* key, const std::string& why) { c.error("config_file", std::string(key) + ": " + why); };
  for (const auto& k : kIntKeys) {
    if (!j.contains(k.key)) continue;
    const auto& v = j[k.key];
    if (!v.is_number_integer()) bad(k.key, "expected an integer, got " + detail::short_dump(v));
    else if (v.get<std::int64_t>() < k.lo || v.get<std::int64_t>() > k.hi)
      bad(k.key, "expected a value in [" + std::to_string(k.lo) + ", " + std::to_string(k.hi) + "], got " + v.dump());
    else
      o.*k.field = v.get<std::int64_t>();
  }
  for (const auto& k : kRealKeys) {
    if (!j.contains(k.key)) continue;
    const auto& v = j[k.key];
    if (!v.is_number() || !(v.get<double>() >= k.lo && v.get<double>() <= k.hi))
      bad(k.key,
          "expected a number in [" + std::to_string(k.lo) + ", " + std::to_string(k.hi) + "], got " + detail::short_dump(v));
    else
      o.*k.field = v.get<double>();
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "gelu")
    c.error("config_file", "hidden_act " + detail::short_dump(j["hidden_act"]) + " is not supported (expected \"gelu\")");
  if (j.contains("position_embedding_type") && j["position_embedding_type"] != "absolute")
    c.error("config_file", "position_embedding_type " + detail::short_dump(j["position_embedding_type"]) +
                               " is not supported (expected \"absolute\")");
}

void normal_(torch::Tensor& t, double std) {
  torch::NoGradGuard ng;
  t.normal_(0.0, std);
}

/// transformers' BertPreTrainedModel._init_weights for a Linear: normal weight, zero bias.
std::shared_ptr<refit::nn::Linear> linear(std::int64_t in, std::int64_t out, double std) {
  auto l = std::make_shared<refit::nn::Linear>(in, out);
  normal_(l->weight, std);
  torch::NoGradGuard ng;
  l->bias.zero_();
  return l;
}

torch::nn::LayerNorm layer_norm(const BertOptions& o) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden_size}).eps(o.layer_norm_eps));
}

torch::nn::Embedding embedding(std::int64_t n, std::int64_t dim, double std, std::int64_t padding_idx = -1) {
  torch::nn::Embedding e(n, dim);
  normal_(e->weight, std);
  if (padding_idx >= 0 && padding_idx < n) {
    torch::NoGradGuard ng;
    e->weight[padding_idx].zero_();
  }
  return e;
}

/// "output" and "normalize": the recipe's, else what the config file's sentence-transformers
/// folder declares (modules.json, the Pooling module's config.json), else the defaults.
void read_pooling(const ConfigReader& c, const std::optional<std::filesystem::path>& config_file, BertOptions& o) {
  const bool output_set = c.has("output"), normalize_set = c.has("normalize");
  o.output = c.choice("output", {"mean", "cls", "max", "pooler"}, o.output);
  o.normalize = c.optional<bool>("normalize", o.normalize);
  if (output_set) o.output_from = "the recipe";
  if (normalize_set) o.normalize_from = "the recipe";
  if (!config_file || (output_set && normalize_set)) return;
  try {
    const DeclaredPooling d = declared_pooling(config_file->parent_path(), o.hidden_size, !output_set);
    if (!output_set && d.output) o.output = *d.output, o.output_from = d.output_source;
    if (!normalize_set && d.normalize) o.normalize = *d.normalize, o.normalize_from = d.normalize_source;
  } catch (const std::exception& e) {
    c.error("config_file", e.what());
  }
}

}  // namespace

BertOptions BertOptions::from_config(const ConfigReader& c) {
  BertOptions o;
  std::optional<std::filesystem::path> config_file;
  if (c.has("config_file")) {
    const auto file = c.path("config_file");
    config_file = file;
    std::ifstream in(file);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!in || j.is_discarded() || !j.is_object())
      c.error("config_file", "cannot read a transformers config.json from " + file.string());
    else
      read_config_json(j, o, c);
  }
  for (const auto& k : kIntKeys) o.*k.field = c.number_in<std::int64_t>(k.key, o.*k.field, k.lo, k.hi);
  for (const auto& k : kRealKeys) o.*k.field = c.number_in<double>(k.key, o.*k.field, k.lo, k.hi);
  o.add_pooling_layer = c.optional<bool>("add_pooling_layer", o.add_pooling_layer);
  read_pooling(c, config_file, o);
  if (o.num_attention_heads > 0 && o.hidden_size % o.num_attention_heads != 0)
    c.error("num_attention_heads", "expected a divisor of hidden_size (" + std::to_string(o.hidden_size) + "), got " +
                                       std::to_string(o.num_attention_heads));
  if (o.layer_norm_eps <= 0) c.error("layer_norm_eps", "expected a positive value");
  if (o.output == "pooler" && !o.add_pooling_layer)
    c.error("output", "\"pooler\" needs the pooling layer (add_pooling_layer: true)");
  return o;
}

namespace bert {

Embeddings::Embeddings(const BertOptions& o) : dropout_p(o.hidden_dropout_prob) {
  word_embeddings =
      register_module("word_embeddings", embedding(o.vocab_size, o.hidden_size, o.initializer_range, o.pad_token_id));
  position_embeddings =
      register_module("position_embeddings", embedding(o.max_position_embeddings, o.hidden_size, o.initializer_range));
  token_type_embeddings =
      register_module("token_type_embeddings", embedding(o.type_vocab_size, o.hidden_size, o.initializer_range));
  LayerNorm = register_module("LayerNorm", layer_norm(o));
  position_ids = register_buffer("position_ids", torch::arange(o.max_position_embeddings, torch::kLong).unsqueeze(0));
}

torch::Tensor Embeddings::forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids) {
  const std::int64_t length = input_ids.size(1);
  const torch::Tensor positions = position_ids.narrow(1, 0, length);
  torch::Tensor e = word_embeddings->forward(input_ids) + token_type_embeddings->forward(token_type_ids) +
                    position_embeddings->forward(positions);
  return text::dropout(LayerNorm->forward(e), dropout_p, is_training());
}

SelfAttention::SelfAttention(const BertOptions& o) {
  query = register_module("query", linear(o.hidden_size, o.hidden_size, o.initializer_range));
  key = register_module("key", linear(o.hidden_size, o.hidden_size, o.initializer_range));
  value = register_module("value", linear(o.hidden_size, o.hidden_size, o.initializer_range));
}

SelfOutput::SelfOutput(const BertOptions& o) {
  dense = register_module("dense", linear(o.hidden_size, o.hidden_size, o.initializer_range));
  LayerNorm = register_module("LayerNorm", layer_norm(o));
}

Attention::Attention(const BertOptions& o)
    : heads_(o.num_attention_heads), head_dim_(o.hidden_size / o.num_attention_heads),
      dropout_(o.attention_probs_dropout_prob), hidden_dropout_(o.hidden_dropout_prob) {
  self = register_module("self", std::make_shared<SelfAttention>(o));
  output = register_module("output", std::make_shared<SelfOutput>(o));
}

torch::Tensor Attention::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  const std::int64_t b = x.size(0), t = x.size(1);
  auto heads = [&](const torch::Tensor& y) { return y.view({b, t, heads_, head_dim_}).transpose(1, 2); };
  const torch::Tensor q = heads(self->query->forward(x));
  const torch::Tensor k = heads(self->key->forward(x));
  const torch::Tensor v = heads(self->value->forward(x));
  torch::Tensor context;
  if (is_training() && dropout_ > 0 && x.device().is_cpu()) {
    // ATen's attention with dropout on the CPU is its math path (the flash kernel takes no
    // dropout); the same ops here, with the mask drawn in bulk (text/dropout.h).
    const double s = std::sqrt(1.0 / std::sqrt(static_cast<double>(head_dim_)));  // as ATen: q and k each by sqrt(scale)
    torch::Tensor scores = at::matmul(q * s, (k * s).transpose(-2, -1));
    if (mask.defined()) scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
    context = at::matmul(text::dropout(at::softmax(scores, -1), dropout_, true), v);
  } else {
    context = at::scaled_dot_product_attention(q, k, v, mask, is_training() ? dropout_ : 0.0, false);
  }
  context = context.transpose(1, 2).reshape({b, t, heads_ * head_dim_});
  torch::Tensor h = text::dropout(output->dense->forward(context), hidden_dropout_, is_training());
  return output->LayerNorm->forward(h + x);
}

Intermediate::Intermediate(const BertOptions& o) {
  dense = register_module("dense", linear(o.hidden_size, o.intermediate_size, o.initializer_range));
}

Output::Output(const BertOptions& o) {
  dense = register_module("dense", linear(o.intermediate_size, o.hidden_size, o.initializer_range));
  LayerNorm = register_module("LayerNorm", layer_norm(o));
}

Layer::Layer(const BertOptions& o) : dropout_(o.hidden_dropout_prob) {
  attention = register_module("attention", std::make_shared<Attention>(o));
  intermediate = register_module("intermediate", std::make_shared<Intermediate>(o));
  output = register_module("output", std::make_shared<Output>(o));
}

torch::Tensor Layer::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  const torch::Tensor a = attention->forward(x, mask);
  const torch::Tensor h = at::gelu(intermediate->dense->forward(a));  // exact (erf) GELU, "gelu"
  return output->LayerNorm->forward(text::dropout(output->dense->forward(h), dropout_, is_training()) + a);
}

Encoder::Encoder(const BertOptions& o) {
  layer = register_module("layer", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < o.num_hidden_layers; ++i) {
    layers_.push_back(std::make_shared<Layer>(o));
    layer->push_back(layers_.back());
  }
}

torch::Tensor Encoder::forward(torch::Tensor x, const torch::Tensor& mask, const std::vector<bool>& recompute) {
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const auto& l = layers_[i];
    if (i < recompute.size() && recompute[i])
      x = recompute_in_backward(*l, [l](const std::vector<torch::Tensor>& in) { return l->forward(in[0], in[1]); },
                                {x, mask});
    else
      x = l->forward(x, mask);
  }
  return x;
}

Pooler::Pooler(const BertOptions& o) {
  dense = register_module("dense", linear(o.hidden_size, o.hidden_size, o.initializer_range));
}

}  // namespace bert

Bert::Bert(BertOptions options) : options_(std::move(options)) {
  embeddings = register_module("embeddings", std::make_shared<bert::Embeddings>(options_));
  encoder = register_module("encoder", std::make_shared<bert::Encoder>(options_));
  if (options_.add_pooling_layer) pooler = register_module("pooler", std::make_shared<bert::Pooler>(options_));
}

std::vector<std::string> Bert::checkpointable_blocks() const {
  std::vector<std::string> blocks;
  for (std::size_t i = 0; i < encoder->size(); ++i) blocks.push_back("encoder.layer." + std::to_string(i));
  return blocks;
}

std::vector<std::string> Bert::output_fields() const {
  std::vector<std::string> out{"features", "last_hidden_state"};
  if (pooler) out.push_back("pooler_output");
  return out;
}

torch::Tensor masked_max(const torch::Tensor& states, const torch::Tensor& attention_mask) {
  const torch::Tensor padding = attention_mask.unsqueeze(-1).eq(0);
  return states.to(torch::kFloat).masked_fill(padding, -1e9).amax(1);
}

std::string Bert::describe() const {
  const BertOptions& o = options_;
  return "bert, " + std::to_string(o.num_hidden_layers) + " layers, hidden " + std::to_string(o.hidden_size) +
         ", features " + o.output + " (" + o.output_from + "), normalize " + (o.normalize ? "true" : "false") + " (" +
         o.normalize_from + ")";
}

torch::Tensor masked_mean(const torch::Tensor& states, const torch::Tensor& attention_mask) {
  const torch::Tensor m = attention_mask.unsqueeze(-1).to(torch::kFloat);
  return (states.to(torch::kFloat) * m).sum(1) / m.sum(1).clamp_min(1e-9);
}

Fields Bert::forward_fields(const Fields& inputs) {
  const torch::Tensor& ids = inputs.at("input_ids");
  const torch::Tensor& attention_mask = inputs.at("attention_mask");
  const torch::Tensor& token_types = inputs.at("token_type_ids");
  if (ids.dim() != 2 || attention_mask.sizes() != ids.sizes() || token_types.sizes() != ids.sizes())
    throw Error("bert: expected input_ids, attention_mask and token_type_ids of one shape [batch, length], got " +
                c10::str(ids.sizes()) + ", " + c10::str(attention_mask.sizes()) + ", " + c10::str(token_types.sizes()));
  if (ids.size(1) > options_.max_position_embeddings)
    throw Error("bert: sequences of " + std::to_string(ids.size(1)) + " tokens are longer than max_position_embeddings (" +
                std::to_string(options_.max_position_embeddings) + "); truncate them in the tokenizer");
  const torch::Tensor mask = attention_mask.to(torch::kBool).view({ids.size(0), 1, 1, ids.size(1)});
  std::vector<bool> recompute(encoder->size());
  for (std::size_t i = 0; i < recompute.size(); ++i) recompute[i] = checkpointed("encoder.layer." + std::to_string(i));
  const torch::Tensor states = encoder->forward(embeddings->forward(ids, token_types), mask, recompute);
  Fields out{{"last_hidden_state", states}};
  torch::Tensor pooled;
  if (pooler) {
    pooled = at::tanh(pooler->dense->forward(states.select(1, 0)));
    out.set("pooler_output", pooled);
  }
  torch::Tensor features = options_.output == "mean"  ? masked_mean(states, attention_mask)
                           : options_.output == "max" ? masked_max(states, attention_mask)
                           : options_.output == "cls" ? states.select(1, 0)
                                                      : pooled;
  if (options_.normalize) features = features / features.norm(2, {1}, true).clamp_min(1e-12);
  out.set("features", features);
  return out;
}

}  // namespace refit::text
