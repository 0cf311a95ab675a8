#include "llama.h"

#include <cmath>
#include <fstream>
#include <map>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "fused_inference.h"
#include "one_query_attention.h"
#include "refit/error.h"
#include "refit/recompute.h"

namespace refit::llm {

namespace {

/// The architecture keys of a LlamaConfig with their ranges: read from a config.json or a GGUF
/// file first, then from the recipe (which overrides), every value checked whatever its source.
struct IntKey {
  const char* key;
  std::int64_t LlamaOptions::*field;
  std::int64_t lo, hi;
};
struct RealKey {
  const char* key;
  double LlamaOptions::*field;
  double lo, hi;
};
struct BoolKey {
  const char* key;
  bool LlamaOptions::*field;
};
constexpr IntKey kIntKeys[] = {{"vocab_size", &LlamaOptions::vocab_size, 1, std::int64_t{1} << 24},
                               {"hidden_size", &LlamaOptions::hidden_size, 1, 1 << 18},
                               {"intermediate_size", &LlamaOptions::intermediate_size, 1, 1 << 20},
                               {"num_hidden_layers", &LlamaOptions::num_hidden_layers, 1, 1024},
                               {"num_attention_heads", &LlamaOptions::num_attention_heads, 1, 4096},
                               {"num_key_value_heads", &LlamaOptions::num_key_value_heads, 0, 4096},
                               {"head_dim", &LlamaOptions::head_dim, 0, 4096},
                               {"max_position_embeddings", &LlamaOptions::max_position_embeddings, 1, 1 << 24},
                               {"pad_token_id", &LlamaOptions::pad_token_id, -1, std::int64_t{1} << 24},
                               {"sliding_window", &LlamaOptions::sliding_window, 0, 1 << 24}};
constexpr RealKey kRealKeys[] = {{"rms_norm_eps", &LlamaOptions::rms_norm_eps, 0.0, 1.0},
                                 {"attention_dropout", &LlamaOptions::attention_dropout, 0.0, 1.0},
                                 {"initializer_range", &LlamaOptions::initializer_range, 0.0, 10.0},
                                 {"rope_theta", &LlamaOptions::rope_theta, 1.0, 1e12}};
constexpr BoolKey kBoolKeys[] = {{"attention_bias", &LlamaOptions::attention_bias},
                                 {"mlp_bias", &LlamaOptions::mlp_bias},
                                 {"tie_word_embeddings", &LlamaOptions::tie_word_embeddings}};

/// rope_parameters (transformers 5) or rope_scaling (older config.json files): the rope type and
/// its parameters, into `o`. `bad(key, why)` reports at the place the object came from.
template <class Bad>
void read_rope(const nlohmann::json& r, LlamaOptions& o, bool& original_given, Bad&& bad) {
  if (!r.is_object()) return bad("rope_parameters", "expected an object, got " + detail::short_dump(r));
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  if (r.contains(type_key)) {
    if (!r[type_key].is_string() || (r[type_key] != "default" && r[type_key] != "llama3"))
      return bad("rope_parameters", std::string(type_key) + " " + detail::short_dump(r[type_key]) +
                                        " is not supported (expected \"default\" or \"llama3\")");
    o.rope_type = r[type_key].get<std::string>();
  }
  auto real = [&](const char* key, double& field, double lo, double hi) {
    if (!r.contains(key) || r[key].is_null()) return;
    if (!r[key].is_number() || !(r[key].get<double>() >= lo && r[key].get<double>() <= hi))
      bad("rope_parameters", std::string(key) + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                 "], got " + detail::short_dump(r[key]));
    else
      field = r[key].get<double>();
  };
  real("rope_theta", o.rope_theta, 1.0, 1e12);
  real("factor", o.rope_factor, 1e-6, 1e6);
  real("low_freq_factor", o.rope_low_freq_factor, 1e-6, 1e6);
  real("high_freq_factor", o.rope_high_freq_factor, 1e-6, 1e6);
  if (r.contains("original_max_position_embeddings")) {
    const auto& v = r["original_max_position_embeddings"];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > (1 << 24))
      bad("rope_parameters",
          "original_max_position_embeddings: expected an integer in [1, 16777216], got " + detail::short_dump(v));
    else {
      o.rope_original_max_position_embeddings = v.get<std::int64_t>();
      original_given = true;
    }
  }
}

/// The architecture keys of a transformers config.json, into `o`; errors at "config_file".
void read_config_json(const nlohmann::json& j, LlamaOptions& o, bool& original_given, const ConfigReader& c) {
  auto bad = [&](const std::string& key, const std::string& why) { c.error("config_file", key + ": " + why); };
  const std::string type = j.value("model_type", std::string("llama"));
  if (type != "llama" && type != "mistral" && type != "qwen2")
    bad("model_type", "\"" + type + "\" is not supported (expected \"llama\", \"mistral\" or \"qwen2\")");
  for (const auto& k : kIntKeys) {
    if (!j.contains(k.key) || j[k.key].is_null()) continue;  // null: the default (no padding id, no window)
    const auto& v = j[k.key];
    if (!v.is_number_integer()) bad(k.key, "expected an integer, got " + detail::short_dump(v));
    else if (v.get<std::int64_t>() < k.lo || v.get<std::int64_t>() > k.hi)
      bad(k.key, "expected a value in [" + std::to_string(k.lo) + ", " + std::to_string(k.hi) + "], got " + v.dump());
    else
      o.*k.field = v.get<std::int64_t>();
  }
  for (const auto& k : kRealKeys) {
    if (!j.contains(k.key) || j[k.key].is_null()) continue;
    const auto& v = j[k.key];
    if (!v.is_number() || !(v.get<double>() >= k.lo && v.get<double>() <= k.hi))
      bad(k.key,
          "expected a number in [" + std::to_string(k.lo) + ", " + std::to_string(k.hi) + "], got " + detail::short_dump(v));
    else
      o.*k.field = v.get<double>();
  }
  for (const auto& k : kBoolKeys) {
    if (!j.contains(k.key)) continue;
    if (!j[k.key].is_boolean()) bad(k.key, "expected true or false, got " + detail::short_dump(j[k.key]));
    else
      o.*k.field = j[k.key].get<bool>();
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    bad("hidden_act", detail::short_dump(j["hidden_act"]) + " is not supported (expected \"silu\")");
  if (j.contains("pretraining_tp") && j["pretraining_tp"].is_number_integer() && j["pretraining_tp"].get<int>() != 1)
    bad("pretraining_tp", "only 1 is supported (the sliced projections give the same result up to rounding)");
  if (type == "qwen2") {
    o.qkv_bias = true;  // Qwen2Attention: q, k, v with bias, o without (no attention_bias key)
    // Qwen2's window applies only where use_sliding_window is set (and then per layer type).
    o.sliding_window = 0;
    if (j.value("use_sliding_window", false)) bad("use_sliding_window", "Qwen2's per-layer sliding window is not supported");
  }
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (j.contains(key) && !j[key].is_null())
      read_rope(j[key], o, original_given, [&](const std::string&, const std::string& why) { bad(key, why); });
  o.model_type = type;
  // Special ids: an integer, or (Llama 3's eos) a list of them; null or absent: none.
  auto ids = [&](const char* key) {
    std::vector<std::int64_t> out;
    if (!j.contains(key) || j[key].is_null()) return out;
    const auto& v = j[key];
    for (const auto& id : v.is_array() ? v : nlohmann::json::array({v})) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0)
        bad(key, "expected a token id or a list of them, got " + detail::short_dump(v));
      else
        out.push_back(id.get<std::int64_t>());
    }
    return out;
  };
  const auto bos = ids("bos_token_id");
  if (bos.size() > 1) bad("bos_token_id", "expected one token id, got " + detail::short_dump(j["bos_token_id"]));
  if (bos.size() == 1) o.bos_token_id = bos.front();
  o.eos_token_ids = ids("eos_token_id");
}

/// The hyperparameters of a GGUF file (llama.cpp's `<arch>.*` keys, as transformers' GGUF loader
/// maps them); errors at "gguf".
void read_gguf(const std::filesystem::path& file, LlamaOptions& o, const ConfigReader& c) {
  try {
    const io::GgufFile g = io::GgufFile::open(file);
    const std::string arch = g.architecture();
    if (arch != "llama" && arch != "qwen2" && arch != "mistral") {
      c.error("gguf", file.string() + ": general.architecture \"" + arch +
                          "\" is not supported (expected \"llama\", \"qwen2\" or \"mistral\")");
      return;
    }
    const std::string p = arch + ".";
    auto count = [&](const std::string& key, std::int64_t& field) {
      if (g.has(p + key)) field = static_cast<std::int64_t>(g.get_uint(p + key));
    };
    count("block_count", o.num_hidden_layers);
    count("embedding_length", o.hidden_size);
    count("feed_forward_length", o.intermediate_size);
    count("attention.head_count", o.num_attention_heads);
    count("attention.head_count_kv", o.num_key_value_heads);
    count("context_length", o.max_position_embeddings);
    count("rope.dimension_count", o.head_dim);
    if (g.has(p + "rope.freq_base")) o.rope_theta = g.get_float(p + "rope.freq_base");
    if (g.has(p + "attention.layer_norm_rms_epsilon")) o.rms_norm_eps = g.get_float(p + "attention.layer_norm_rms_epsilon");
    if (g.has(p + "vocab_size")) o.vocab_size = static_cast<std::int64_t>(g.get_uint(p + "vocab_size"));
    else if (g.has("tokenizer.ggml.tokens"))
      o.vocab_size = static_cast<std::int64_t>(g.get_string_array("tokenizer.ggml.tokens").size());
    if (g.has("tokenizer.ggml.padding_token_id"))
      o.pad_token_id = static_cast<std::int64_t>(g.get_uint("tokenizer.ggml.padding_token_id"));
    if (g.has("tokenizer.ggml.bos_token_id"))
      o.bos_token_id = static_cast<std::int64_t>(g.get_uint("tokenizer.ggml.bos_token_id"));
    if (g.has("tokenizer.ggml.eos_token_id"))
      o.eos_token_ids = {static_cast<std::int64_t>(g.get_uint("tokenizer.ggml.eos_token_id"))};
    o.model_type = arch;
    // llama.cpp stores the llama3 rope scaling as a tensor of frequency factors, not as keys.
    if (g.contains("rope_freqs.weight") && !c.has("rope_parameters"))
      c.error("gguf", file.string() +
                          ": holds rope_freqs.weight (a scaled rope); give the scaling as rope_parameters in the recipe");
    o.tie_word_embeddings = !g.contains("output.weight");
    o.qkv_bias = g.contains("blk.0.attn_q.bias") && !g.contains("blk.0.attn_output.bias");
    o.attention_bias = g.contains("blk.0.attn_q.bias") && g.contains("blk.0.attn_output.bias");
    o.mlp_bias = g.contains("blk.0.ffn_gate.bias");
  } catch (const Error& e) {
    c.error("gguf", e.what());
  }
}

void normal_(const torch::Tensor& t, double std) {
  torch::NoGradGuard ng;
  t.normal_(0.0, std);
}

/// transformers' _init_weights for a Linear: normal weight, zero bias (or placeholders a
/// weights file replaces).
std::shared_ptr<refit::nn::Linear> linear(std::int64_t in, std::int64_t out, bool bias, const LlamaOptions& o) {
  if (o.init == refit::nn::Init::none) return std::make_shared<refit::nn::Linear>(in, out, bias, refit::nn::Init::none);
  auto l = std::make_shared<refit::nn::Linear>(in, out, bias);
  normal_(l->weight, o.initializer_range);
  torch::NoGradGuard ng;
  if (bias) l->bias.zero_();
  return l;
}

/// The rotate-half form of the rotary embedding: x cos + rotate_half(x) sin, where
/// rotate_half([x1, x2]) = [-x2, x1] over the two halves of the head dimension.
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  // Under InferenceMode (generate), one loop (fused_inference.h). Not for every forward without
  // gradients: a checkpointed block's first forward runs without them and its recomputation with
  // them, and both must give the same numbers.
  if (c10::InferenceMode::is_enabled() && rotate_inference_fits(x, cos, sin)) return rotate_inference(x, cos, sin);
  const std::int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated = at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

/// Positions from a [B, S] mask of the tokens so far, as transformers' generate derives them:
/// the count of real tokens before each one (cumsum - 1), padding at 1. `last` columns are kept.
torch::Tensor positions_from_mask(const torch::Tensor& mask, std::int64_t last) {
  const torch::Tensor m = mask.to(torch::kLong);
  const torch::Tensor pos = (m.cumsum(-1) - 1).masked_fill(m == 0, 1);
  return pos.narrow(1, pos.size(1) - last, last);
}

/// The attention mask [B, 1, S, L + S] for `S` queries after `L` cached positions: key j is seen
/// by query i (absolute position L + i) when j <= L + i, within the sliding window, and `keys`
/// [B, L + S] (undefined: all) marks it a token. Each query always sees itself, so that a padding
/// query's row is never empty (an empty row is NaN in softmax, and NaN reaches the gradients of
/// real tokens through 0 * NaN); real queries' rows are unchanged by that.
torch::Tensor build_mask(const torch::Tensor& keys, std::int64_t batch, std::int64_t past, std::int64_t s,
                         std::int64_t window, const c10::Device& device) {
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  const torch::Tensor q = at::arange(past, past + s, opts).unsqueeze(1);  // [S, 1]
  const torch::Tensor k = at::arange(past + s, opts).unsqueeze(0);        // [1, L + S]
  torch::Tensor allowed = k <= q;
  if (window > 0) allowed = allowed & ((q - k) < window);
  torch::Tensor mask = allowed.unsqueeze(0).unsqueeze(0).expand({batch, 1, s, past + s});
  if (keys.defined()) mask = mask & keys.to(torch::kBool).view({batch, 1, 1, past + s});
  return mask | (k == q).unsqueeze(0).unsqueeze(0);
}

}  // namespace

LlamaOptions LlamaOptions::from_config(const ConfigReader& c) {
  LlamaOptions o;
  bool original_given = false;
  if (c.has("config_file") && c.has("gguf")) c.error("gguf", "give either config_file or gguf, not both");
  if (c.has("config_file")) {
    const auto file = c.path("config_file");
    std::ifstream in(file);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!in || j.is_discarded() || !j.is_object())
      c.error("config_file", "cannot read a transformers config.json from " + file.string());
    else
      read_config_json(j, o, original_given, c);
  } else if (c.has("gguf")) {
    read_gguf(c.path("gguf"), o, c);
  }
  for (const auto& k : kIntKeys) o.*k.field = c.number_in<std::int64_t>(k.key, o.*k.field, k.lo, k.hi);
  for (const auto& k : kRealKeys) o.*k.field = c.number_in<double>(k.key, o.*k.field, k.lo, k.hi);
  for (const auto& k : kBoolKeys) o.*k.field = c.optional<bool>(k.key, o.*k.field);
  o.qkv_bias = c.optional<bool>("qkv_bias", o.qkv_bias);
  if (c.has("rope_parameters"))
    read_rope(c.raw()["rope_parameters"], o, original_given,
              [&](const std::string&, const std::string& why) { c.error("rope_parameters", why); });
  // transformers' standardize_rope_params: llama3 without the original length takes max_position_embeddings.
  if (!original_given) o.rope_original_max_position_embeddings = o.max_position_embeddings;
  o.output = c.choice("output", {"logits", "hidden_states"}, o.output);
  o.read_attention_mask = c.optional<bool>("attention_mask", o.read_attention_mask);
  o.read_position_ids = c.optional<bool>("position_ids", o.read_position_ids);
  o.packed = c.optional<bool>("packed", o.packed);
  if (o.packed) o.read_position_ids = true;
  if (o.num_key_value_heads > 0 && o.num_attention_heads % o.num_key_value_heads != 0)
    c.error("num_key_value_heads", "expected a divisor of num_attention_heads (" + std::to_string(o.num_attention_heads) +
                                       "), got " + std::to_string(o.num_key_value_heads));
  if (o.head_dim == 0 && o.hidden_size % o.num_attention_heads != 0)
    c.error("num_attention_heads", "expected a divisor of hidden_size (" + std::to_string(o.hidden_size) +
                                       ") or an explicit head_dim, got " + std::to_string(o.num_attention_heads));
  if (o.dim_per_head() % 2 != 0)
    c.error("head_dim", "the rotary embedding needs an even head dimension, got " + std::to_string(o.dim_per_head()));
  if (o.rms_norm_eps <= 0) c.error("rms_norm_eps", "expected a positive value");
  if (o.pad_token_id >= o.vocab_size)
    c.error("pad_token_id", "expected a token id below vocab_size (" + std::to_string(o.vocab_size) + "), got " +
                                std::to_string(o.pad_token_id));
  if (o.rope_type == "llama3" && !(o.rope_high_freq_factor > o.rope_low_freq_factor))
    c.error("rope_parameters", "high_freq_factor must exceed low_freq_factor");
  return o;
}

std::string transformers_config_json(const LlamaOptions& o) {
  static const std::map<std::string, std::string> kClasses{{"llama", "LlamaForCausalLM"},
                                                           {"qwen2", "Qwen2ForCausalLM"},
                                                           {"mistral", "MistralForCausalLM"}};
  nlohmann::json rope{{"rope_type", o.rope_type}, {"rope_theta", o.rope_theta}};
  if (o.rope_type == "llama3") {
    rope["factor"] = o.rope_factor;
    rope["low_freq_factor"] = o.rope_low_freq_factor;
    rope["high_freq_factor"] = o.rope_high_freq_factor;
    rope["original_max_position_embeddings"] = o.rope_original_max_position_embeddings;
  }
  // A recipe may set biases the source architecture has no key for: such a model has no
  // transformers class, and an export saying otherwise would load with keys missing.
  const bool qkv_only = o.qkv_bias && !o.attention_bias;
  if ((o.model_type == "llama" && qkv_only) || (o.model_type == "qwen2" && (o.attention_bias || o.mlp_bias)) ||
      (o.model_type == "mistral" && (o.qkv_bias || o.attention_bias || o.mlp_bias)))
    throw Error("llama: the biases configured (qkv_bias " + std::string(o.qkv_bias ? "true" : "false") +
                ", attention_bias " + (o.attention_bias ? "true" : "false") + ", mlp_bias " +
                (o.mlp_bias ? "true" : "false") + ") have no transformers " + o.model_type + " configuration");
  auto id_or_null = [](std::int64_t id) { return id >= 0 ? nlohmann::json(id) : nlohmann::json(nullptr); };
  nlohmann::json eos = nullptr;
  if (o.eos_token_ids.size() == 1) eos = o.eos_token_ids.front();
  else if (!o.eos_token_ids.empty())
    eos = o.eos_token_ids;
  nlohmann::json j{{"architectures", {kClasses.at(o.model_type)}},
                   {"model_type", o.model_type},
                   {"vocab_size", o.vocab_size},
                   {"hidden_size", o.hidden_size},
                   {"intermediate_size", o.intermediate_size},
                   {"num_hidden_layers", o.num_hidden_layers},
                   {"num_attention_heads", o.num_attention_heads},
                   {"num_key_value_heads", o.kv_heads()},
                   {"head_dim", o.dim_per_head()},
                   {"hidden_act", "silu"},
                   {"max_position_embeddings", o.max_position_embeddings},
                   {"rms_norm_eps", o.rms_norm_eps},
                   {"initializer_range", o.initializer_range},
                   {"attention_dropout", o.attention_dropout},
                   {"rope_parameters", rope},
                   // transformers 4 reads the theta at the top level.
                   {"rope_theta", o.rope_theta},
                   {"tie_word_embeddings", o.tie_word_embeddings},
                   {"pad_token_id", id_or_null(o.pad_token_id)},
                   {"bos_token_id", id_or_null(o.bos_token_id)},
                   {"eos_token_id", eos},
                   {"use_cache", true}};
  if (o.model_type == "llama") {
    j["attention_bias"] = o.attention_bias;
    j["mlp_bias"] = o.mlp_bias;
    j["pretraining_tp"] = 1;
  } else if (o.model_type == "qwen2") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  } else {
    j["sliding_window"] = o.sliding_window > 0 ? nlohmann::json(o.sliding_window) : nlohmann::json(nullptr);
  }
  return j.dump(2);
}

torch::Tensor rope_inverse_frequencies(const LlamaOptions& o) {
  // The same float32 operations, with the same scalars, as transformers' (modeling_rope_utils).
  const std::int64_t dim = o.dim_per_head();
  const torch::Tensor exponent = at::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(dim);
  torch::Tensor inv_freq = at::reciprocal(at::pow(o.rope_theta, exponent));
  if (o.rope_type != "llama3") return inv_freq;
  const double factor = o.rope_factor, low = o.rope_low_freq_factor, high = o.rope_high_freq_factor;
  const std::int64_t old_context = o.rope_original_max_position_embeddings;
  const double low_freq_wavelen = static_cast<double>(old_context) / low;
  const double high_freq_wavelen = static_cast<double>(old_context) / high;
  const torch::Tensor wavelen = at::reciprocal(inv_freq) * (2 * M_PI);
  torch::Tensor llama = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  const torch::Tensor smooth = (at::reciprocal(wavelen) * old_context - low) / (high - low);
  const torch::Tensor smoothed = (1 - smooth) * llama / factor + smooth * llama;
  const torch::Tensor medium = (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, llama);
}

namespace llama {

RMSNorm::RMSNorm(std::int64_t size, double eps, nn::Init init) : eps(eps) {
  weight = register_parameter("weight", init == nn::Init::none ? nn::unloaded({size}) : torch::ones({size}));
}

torch::Tensor RMSNorm::forward(const torch::Tensor& x) const {
  // Under InferenceMode, one loop (fused_inference.h; why only there: rotate()).
  if (c10::InferenceMode::is_enabled() && rms_norm_inference_fits(x, weight)) return rms_norm_inference(x, weight, eps);
  const auto dtype = x.scalar_type();
  torch::Tensor h = x.to(torch::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(dtype);
}

Attention::Attention(const LlamaOptions& o)
    : heads_(o.num_attention_heads), kv_heads_(o.kv_heads()), head_dim_(o.dim_per_head()), dropout_(o.attention_dropout) {
  const bool qkv = o.attention_bias || o.qkv_bias;
  q_proj = register_module("q_proj", linear(o.hidden_size, heads_ * head_dim_, qkv, o));
  k_proj = register_module("k_proj", linear(o.hidden_size, kv_heads_ * head_dim_, qkv, o));
  v_proj = register_module("v_proj", linear(o.hidden_size, kv_heads_ * head_dim_, qkv, o));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, o.hidden_size, o.attention_bias, o));
}

torch::Tensor Attention::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                 const torch::Tensor& mask, KVCache* cache, std::size_t layer) {
  const std::int64_t b = x.size(0), t = x.size(1);
  auto heads = [&](const torch::Tensor& y) { return y.view({b, t, -1, head_dim_}).transpose(1, 2); };
  const torch::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  const torch::Tensor q = rotate(heads(q_proj->forward(x)), c, s);
  torch::Tensor k = rotate(heads(k_proj->forward(x)), c, s);
  torch::Tensor v = heads(v_proj->forward(x));
  if (cache) {
    const std::int64_t past = cache->length;
    torch::Tensor& keys = cache->keys.at(layer);
    torch::Tensor& values = cache->values.at(layer);
    {
      torch::NoGradGuard ng;  // the cache holds values for decoding, not a graph
      keys.narrow(2, past, t).copy_(k);
      values.narrow(2, past, t).copy_(v);
    }
    k = keys.narrow(2, 0, past + t);
    v = values.narrow(2, 0, past + t);
  }
  // GQA: each group of heads / kv_heads query heads shares one key/value head (enable_gqa: the
  // kernel indexes the shared head instead of materialising repeat_kv's copies).
  const bool causal = !mask.defined();
  // A decoding step without gradients (one query per sequence over the cache): one pass over the
  // cached keys and values (one_query_attention.h), unless autocast would first cast the operands.
  const auto device = q.device().type();
  const bool autocast_casts =
      at::autocast::is_autocast_enabled(device) && at::autocast::get_autocast_dtype(device) != q.scalar_type();
  torch::Tensor context =
      cache && t == 1 && mask.defined() && !torch::GradMode::is_enabled() && !autocast_casts &&
              one_query_attention_fits(q, k, v, mask)
          ? one_query_attention(q, k, v, mask)
          : at::scaled_dot_product_attention(q, k, v, mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt,
                                             is_training() ? dropout_ : 0.0, causal, c10::nullopt,
                                             /*enable_gqa=*/kv_heads_ != heads_);
  context = context.transpose(1, 2).reshape({b, t, heads_ * head_dim_});
  return o_proj->forward(context);
}

MLP::MLP(const LlamaOptions& o) {
  gate_proj = register_module("gate_proj", linear(o.hidden_size, o.intermediate_size, o.mlp_bias, o));
  up_proj = register_module("up_proj", linear(o.hidden_size, o.intermediate_size, o.mlp_bias, o));
  down_proj = register_module("down_proj", linear(o.intermediate_size, o.hidden_size, o.mlp_bias, o));
}

torch::Tensor MLP::forward(const torch::Tensor& x) {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

DecoderLayer::DecoderLayer(const LlamaOptions& o) {
  self_attn = register_module("self_attn", std::make_shared<Attention>(o));
  mlp = register_module("mlp", std::make_shared<MLP>(o));
  input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(o.hidden_size, o.rms_norm_eps, o.init));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(o.hidden_size, o.rms_norm_eps, o.init));
}

torch::Tensor DecoderLayer::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                    const torch::Tensor& mask, KVCache* cache, std::size_t layer) {
  const torch::Tensor h = x + self_attn->forward(input_layernorm->forward(x), cos, sin, mask, cache, layer);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

Decoder::Decoder(const LlamaOptions& o) {
  auto e = torch::nn::EmbeddingOptions(o.vocab_size, o.hidden_size);
  if (o.pad_token_id >= 0) e.padding_idx(o.pad_token_id);
  // A given _weight is taken as it is (torch::nn::Embedding initialises only its own).
  if (o.init == nn::Init::none) e._weight(nn::unloaded({o.vocab_size, o.hidden_size}));
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(e));
  if (o.init == nn::Init::random) normal_(embed_tokens->weight, o.initializer_range);
  if (o.init == nn::Init::random && o.pad_token_id >= 0) {
    torch::NoGradGuard ng;
    embed_tokens->weight[o.pad_token_id].zero_();
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < o.num_hidden_layers; ++i) {
    layer_list.push_back(std::make_shared<DecoderLayer>(o));
    layers->push_back(layer_list.back());
  }
  norm = register_module("norm", std::make_shared<RMSNorm>(o.hidden_size, o.rms_norm_eps, o.init));
}

}  // namespace llama

Llama::Llama(LlamaOptions options) : options_(std::move(options)) {
  model = register_module("model", std::make_shared<llama::Decoder>(options_));
  if (!options_.tie_word_embeddings)
    lm_head = register_module("lm_head", linear(options_.hidden_size, options_.vocab_size, false, options_));
  inv_freq_ = rope_inverse_frequencies(options_);
}

std::vector<std::string> Llama::input_fields() const {
  std::vector<std::string> in{"input_ids"};
  if (options_.read_attention_mask) in.push_back("attention_mask");
  if (options_.read_position_ids) in.push_back("position_ids");
  if (options_.packed) in.push_back("segment_ids");
  return in;
}

std::vector<std::string> Llama::output_fields() const {
  if (options_.output == "hidden_states") return {"hidden_states", "lm_head_weight"};
  return {"logits"};
}

std::vector<std::string> Llama::checkpointable_blocks() const {
  std::vector<std::string> blocks;
  for (std::size_t i = 0; i < model->layer_list.size(); ++i) blocks.push_back("model.layers." + std::to_string(i));
  return blocks;
}

torch::Tensor Llama::inverse_frequencies(const c10::Device& device) {
  if (device.is_cpu()) return inv_freq_;
  if (!inv_freq_device_.defined() || inv_freq_device_.device() != device) inv_freq_device_ = inv_freq_.to(device);
  return inv_freq_device_;
}

torch::Tensor Llama::run_layers(torch::Tensor x, const torch::Tensor& positions, const torch::Tensor& mask, KVCache* cache) {
  // cos/sin in float32 (transformers' LlamaRotaryEmbedding), then in the hidden states' dtype.
  const torch::Tensor freqs = positions.to(torch::kFloat).unsqueeze(-1) * inverse_frequencies(x.device());
  const torch::Tensor emb = at::cat({freqs, freqs}, -1);
  const torch::Tensor cos = emb.cos().to(x.scalar_type()), sin = emb.sin().to(x.scalar_type());
  for (std::size_t i = 0; i < model->layer_list.size(); ++i) {
    const auto& l = model->layer_list[i];
    if (!cache && checkpointed("model.layers." + std::to_string(i))) {
      std::vector<torch::Tensor> in{x, cos, sin};
      if (mask.defined()) in.push_back(mask);
      x = recompute_in_backward(
          *l,
          [l](const std::vector<torch::Tensor>& t) {
            return l->forward(t[0], t[1], t[2], t.size() > 3 ? t[3] : torch::Tensor());
          },
          in);
    } else {
      x = l->forward(x, cos, sin, mask, cache, i);
    }
  }
  return model->norm->forward(x);
}

torch::Tensor Llama::hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                   const torch::Tensor& position_ids, const torch::Tensor& segment_ids) {
  if (input_ids.dim() != 2) throw Error("llama: expected input_ids [batch, length], got " + c10::str(input_ids.sizes()));
  const std::int64_t b = input_ids.size(0), t = input_ids.size(1);
  if (attention_mask.defined() && attention_mask.sizes() != input_ids.sizes())
    throw Error("llama: attention_mask " + c10::str(attention_mask.sizes()) + " does not match input_ids " +
                c10::str(input_ids.sizes()));
  if (position_ids.defined() && position_ids.sizes() != input_ids.sizes())
    throw Error("llama: position_ids " + c10::str(position_ids.sizes()) + " does not match input_ids " +
                c10::str(input_ids.sizes()));
  const torch::Tensor positions = position_ids.defined() ? position_ids
                                  : attention_mask.defined()
                                      ? positions_from_mask(attention_mask, t)
                                      : at::arange(t, input_ids.options().dtype(torch::kLong)).unsqueeze(0).expand({b, t});
  // Without padding or a window the kernel's own causal masking (no mask tensor) is exact.
  if (segment_ids.defined() && segment_ids.sizes() != input_ids.sizes())
    throw Error("llama: segment_ids " + c10::str(segment_ids.sizes()) + " do not match input_ids " +
                c10::str(input_ids.sizes()));
  torch::Tensor mask;
  if (attention_mask.defined() || options_.sliding_window > 0 || segment_ids.defined())
    mask = build_mask(attention_mask, b, 0, t, options_.sliding_window, input_ids.device());
  // Packed samples: a key of another segment is not seen (the diagonal, always seen, is in the
  // query's own segment).
  if (segment_ids.defined()) mask = mask & (segment_ids.unsqueeze(2) == segment_ids.unsqueeze(1)).unsqueeze(1);
  return run_layers(model->embed_tokens->forward(input_ids), positions, mask, nullptr);
}

torch::Tensor Llama::lm_head_weight() const { return lm_head ? lm_head->dense_weight() : model->embed_tokens->weight; }

std::vector<std::string> Llama::dense_layers() const {
  if (lm_head) return {"lm_head"};
  return {};
}

torch::Tensor Llama::logits(const torch::Tensor& hidden_states) {
  return lm_head ? lm_head->forward(hidden_states) : at::linear(hidden_states, model->embed_tokens->weight);
}

Fields Llama::forward_fields(const Fields& inputs) {
  const torch::Tensor states =
      hidden_states(inputs.at("input_ids"), options_.read_attention_mask ? inputs.at("attention_mask") : torch::Tensor(),
                    options_.read_position_ids ? inputs.at("position_ids") : torch::Tensor(),
                    options_.packed ? inputs.at("segment_ids") : torch::Tensor());
  if (options_.output == "hidden_states") return Fields{{"hidden_states", states}, {"lm_head_weight", lm_head_weight()}};
  return Fields{{"logits", logits(states)}};
}

namespace {

/// Llama::forward_step() behind the SDK's IncrementalDecoder (refit generate).
class LlamaDecoder : public IncrementalDecoder {
 public:
  explicit LlamaDecoder(Llama& model) : model_(model) {}
  struct Cache : IncrementalDecoder::Cache {
    KVCache kv;
  };
  std::unique_ptr<IncrementalDecoder::Cache> start(std::int64_t batch, std::int64_t capacity) override {
    auto c = std::make_unique<Cache>();
    c->kv = model_.make_cache(batch, capacity);
    return c;
  }
  torch::Tensor step(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                     IncrementalDecoder::Cache& cache) override {
    // The caches this decoder hands out are its own Cache.
    return model_.forward_step(input_ids, {}, static_cast<Cache&>(cache).kv, attention_mask).to(torch::kFloat);
  }
  std::int64_t max_positions() const override { return model_.options().max_position_embeddings; }

 private:
  Llama& model_;
};

}  // namespace

std::string Llama::reference_config() const { return transformers_config_json(options_); }

IncrementalDecoder* Llama::decoder() {
  if (!decoder_) decoder_ = std::make_unique<LlamaDecoder>(*this);
  return decoder_.get();
}

KVCache Llama::make_cache(std::int64_t batch, std::int64_t capacity) const {
  const torch::Tensor& w = model->embed_tokens->weight;
  KVCache cache;
  for (std::size_t i = 0; i < model->layer_list.size(); ++i) {
    cache.keys.push_back(torch::zeros({batch, options_.kv_heads(), capacity, options_.dim_per_head()}, w.options()));
    cache.values.push_back(torch::zeros_like(cache.keys.back()));
  }
  return cache;
}

torch::Tensor Llama::forward_step(const torch::Tensor& input_ids, const torch::Tensor& positions, KVCache& cache,
                                  const torch::Tensor& attention_mask) {
  if (input_ids.dim() != 2 || input_ids.size(1) < 1)
    throw Error("llama: expected input_ids [batch, steps] for a decoding step, got " + c10::str(input_ids.sizes()));
  const std::int64_t b = input_ids.size(0), s = input_ids.size(1), past = cache.length;
  if (cache.keys.size() != model->layer_list.size() || cache.batch() != b)
    throw Error("llama: the KV cache is for " + std::to_string(cache.batch()) + " rows and " +
                std::to_string(cache.keys.size()) + " layers, the model has " + std::to_string(model->layer_list.size()) +
                " layers and the step " + std::to_string(b) + " rows (make it with make_cache)");
  if (past + s > cache.capacity())
    throw Error("llama: the KV cache holds " + std::to_string(cache.capacity()) + " positions; " + std::to_string(past) +
                " are filled and the step adds " + std::to_string(s));
  if (attention_mask.defined() &&
      (attention_mask.dim() != 2 || attention_mask.size(0) != b || attention_mask.size(1) != past + s))
    throw Error("llama: a decoding step's attention_mask must cover every position so far [" + std::to_string(b) + ", " +
                std::to_string(past + s) + "], got " + c10::str(attention_mask.sizes()));
  if (positions.defined() && positions.sizes() != input_ids.sizes())
    throw Error("llama: positions " + c10::str(positions.sizes()) + " do not match input_ids " +
                c10::str(input_ids.sizes()));
  const torch::Tensor pos =
      positions.defined() ? positions
      : attention_mask.defined()
          ? positions_from_mask(attention_mask, s)
          : at::arange(past, past + s, input_ids.options().dtype(torch::kLong)).unsqueeze(0).expand({b, s});
  const torch::Tensor mask = build_mask(attention_mask, b, past, s, options_.sliding_window, input_ids.device());
  const torch::Tensor states = run_layers(model->embed_tokens->forward(input_ids), pos, mask, &cache);
  cache.length = past + s;
  return logits(states.select(1, s - 1));
}

namespace {

/// Appends one token per row: finished rows (an EOS produced before) get the padding id.
torch::Tensor next_tokens(const torch::Tensor& logits, torch::Tensor& finished, std::int64_t eos, std::int64_t pad) {
  torch::Tensor next = logits.argmax(-1);
  next = at::where(finished, at::full_like(next, pad), next);
  if (eos >= 0) finished = finished | (next == eos);
  return next;
}

torch::Tensor prompt_mask_or_ones(const torch::Tensor& ids, const torch::Tensor& mask) {
  return mask.defined() ? mask.to(torch::kLong) : at::ones_like(ids, ids.options().dtype(torch::kLong));
}

}  // namespace

torch::Tensor greedy_generate(Llama& model, const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                              std::int64_t max_new_tokens, std::int64_t eos_token_id, std::int64_t pad_token_id) {
  torch::NoGradGuard ng;
  const std::int64_t b = prompt_ids.size(0), p = prompt_ids.size(1);
  KVCache cache = model.make_cache(b, p + max_new_tokens);
  torch::Tensor mask = prompt_mask_or_ones(prompt_ids, prompt_mask);
  torch::Tensor finished = at::zeros({b}, prompt_ids.options().dtype(torch::kBool));
  std::vector<torch::Tensor> out;
  torch::Tensor logits = model.forward_step(prompt_ids, {}, cache, mask);
  for (std::int64_t i = 0; i < max_new_tokens; ++i) {
    out.push_back(next_tokens(logits, finished, eos_token_id, pad_token_id));
    if (i + 1 == max_new_tokens) break;
    mask = at::cat({mask, at::ones({b, 1}, mask.options())}, 1);
    logits = model.forward_step(out.back().unsqueeze(1), {}, cache, mask);
  }
  return at::stack(out, 1);
}

torch::Tensor greedy_generate_uncached(Llama& model, const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                       std::int64_t max_new_tokens, std::int64_t eos_token_id, std::int64_t pad_token_id) {
  torch::NoGradGuard ng;
  const std::int64_t b = prompt_ids.size(0);
  torch::Tensor ids = prompt_ids, mask = prompt_mask_or_ones(prompt_ids, prompt_mask);
  torch::Tensor finished = at::zeros({b}, prompt_ids.options().dtype(torch::kBool));
  std::vector<torch::Tensor> out;
  for (std::int64_t i = 0; i < max_new_tokens; ++i) {
    const torch::Tensor states = model.hidden_states(ids, mask, {});
    out.push_back(next_tokens(model.logits(states.select(1, ids.size(1) - 1)), finished, eos_token_id, pad_token_id));
    ids = at::cat({ids, out.back().unsqueeze(1)}, 1);
    mask = at::cat({mask, at::ones({b, 1}, mask.options())}, 1);
  }
  return at::stack(out, 1);
}

}  // namespace refit::llm
