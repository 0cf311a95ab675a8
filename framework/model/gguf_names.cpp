#include "model/gguf_names.h"

#include <utility>

#include "refit/error.h"

namespace refit {

namespace {

// llama.cpp's per-block tensor names (gguf-py's MODEL_TENSOR names for LLM_ARCH_LLAMA / QWEN2)
// and transformers' module paths inside model.layers.N.
const std::pair<const char*, const char*> kBlockParts[] = {
    {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},   {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"}, {"ffn_gate", "mlp.gate_proj"},    {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},       {"attn_norm", "input_layernorm"}, {"ffn_norm", "post_attention_layernorm"},
};

/// "weight" or "bias" after the last dot, split off; false for another suffix.
bool split_suffix(const std::string& name, std::string& stem, std::string& suffix) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  suffix = name.substr(dot + 1);
  stem = name.substr(0, dot);
  return suffix == "weight" || suffix == "bias";
}

/// A block number written as llama.cpp writes it (decimal, no sign, no leading zero), so that no
/// two GGUF names map to one parameter.
bool canonical_index(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return s == "0" || s[0] != '0';
}

}  // namespace

std::optional<std::string> gguf_to_transformers_name(const std::string& gguf_name) {
  std::string stem, suffix;
  if (!split_suffix(gguf_name, stem, suffix)) return std::nullopt;
  if (stem == "token_embd") return "model.embed_tokens." + suffix;
  if (stem == "output_norm") return "model.norm." + suffix;
  if (stem == "output") return "lm_head." + suffix;
  if (stem.rfind("blk.", 0) != 0) return std::nullopt;
  const auto dot = stem.find('.', 4);
  if (dot == std::string::npos) return std::nullopt;
  const std::string index = stem.substr(4, dot - 4), part = stem.substr(dot + 1);
  if (!canonical_index(index)) return std::nullopt;
  for (const auto& p : kBlockParts)
    if (part == p.first) return "model.layers." + index + "." + p.second + "." + suffix;
  return std::nullopt;
}

GgufLlamaLayout gguf_llama_layout(const io::GgufFile& f) {
  GgufLlamaLayout l;
  l.architecture = f.architecture();
  if (l.architecture != "llama" && l.architecture != "qwen2" && l.architecture != "mistral")
    throw Error(f.label() + ": GGUF architecture \"" + l.architecture +
                "\" is not a llama-family decoder refit loads (llama, qwen2, mistral)");
  const std::string heads = l.architecture + ".attention.head_count";
  const std::uint64_t n_head = f.get_uint(heads);
  const std::uint64_t n_head_kv = f.has(heads + "_kv") ? f.get_uint(heads + "_kv") : n_head;
  if (n_head == 0 || n_head > (1u << 20) || n_head_kv == 0 || n_head_kv > n_head)
    throw Error(f.label() + ": " + heads + " = " + std::to_string(n_head) + " and " + heads +
                "_kv = " + std::to_string(n_head_kv) + " are not a valid head layout");
  l.n_head = static_cast<std::int64_t>(n_head);
  l.n_head_kv = static_cast<std::int64_t>(n_head_kv);
  l.permuted_qk = l.architecture == "llama";
  return l;
}

std::optional<std::int64_t> gguf_qk_permutation_heads(const GgufLlamaLayout& layout, const std::string& gguf_name) {
  if (!layout.permuted_qk || gguf_name.rfind("blk.", 0) != 0) return std::nullopt;
  // The converter permutes q_proj/k_proj weights and biases alike (LlamaModel.modify_tensors).
  if (gguf_name.find(".attn_q.") != std::string::npos) return layout.n_head;
  if (gguf_name.find(".attn_k.") != std::string::npos) return layout.n_head_kv;
  return std::nullopt;
}

torch::Tensor gguf_unpermute_qk_rows(const torch::Tensor& w, std::int64_t n_head, const std::string& what) {
  const std::int64_t rows = w.dim() > 0 ? w.size(0) : 0;
  if (n_head <= 0 || rows % (2 * n_head) != 0)
    throw Error(what + ": " + std::to_string(rows) + " rows cannot be " + std::to_string(n_head) +
                " heads of interleaved rotary pairs (rows must be a multiple of 2 * heads)");
  std::vector<std::int64_t> split = {n_head, rows / n_head / 2, 2};
  for (std::int64_t d = 1; d < w.dim(); ++d) split.push_back(w.size(d));
  // GGUF row (h, i, j) -> transformers row (h, j, i): the first half of each head's rows holds
  // the rotary pairs' first elements, the second half their second elements.
  return w.reshape(split).transpose(1, 2).reshape(w.sizes());
}

}  // namespace refit
