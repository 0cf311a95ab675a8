#pragma once
// Llama-family GGUF files in transformers' terms: llama.cpp's tensor names mapped to the
// parameter names of transformers' LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM
// (which refit's decoder models use too), and the query/key row order that llama.cpp's converter
// (convert_hf_to_gguf.py, LlamaModel.permute) changes for the llama architecture undone, as
// transformers' GGUF loader (modeling_gguf_pytorch_utils.py, LlamaTensorProcessor) undoes it.
#include <cstdint>
#include <optional>
#include <string>

#include <torch/types.h>

#include "io/gguf.h"

namespace refit {

/// transformers' name of a llama-family GGUF tensor ("blk.3.attn_q.weight" ->
/// "model.layers.3.self_attn.q_proj.weight"; token_embd, output_norm and output: embed_tokens,
/// model.norm and lm_head); nullopt for a name outside the map.
std::optional<std::string> gguf_to_transformers_name(const std::string& gguf_name);

/// What loading a llama-family GGUF needs from its metadata.
struct GgufLlamaLayout {
  std::string architecture;    // general.architecture: "llama", "qwen2" or "mistral"
  std::int64_t n_head = 0;     // <arch>.attention.head_count
  std::int64_t n_head_kv = 0;  // <arch>.attention.head_count_kv (n_head when absent, as llama.cpp)
  /// Whether the converter permuted the q/k rows: for "llama" only (transformers undoes it for
  /// that architecture alone; llama.cpp's Qwen2 converter keeps transformers' order).
  bool permuted_qk = false;
};
/// An Error naming the file for another architecture or heads that are missing or not positive.
GgufLlamaLayout gguf_llama_layout(const io::GgufFile& f);

/// The number of heads whose rows the converter interleaved in GGUF tensor `gguf_name` (a q or
/// k projection's weight or bias of a permuted file: n_head for q, n_head_kv for k); nullopt when
/// the tensor is stored in transformers' order.
std::optional<std::int64_t> gguf_qk_permutation_heads(const GgufLlamaLayout& layout, const std::string& gguf_name);

/// Undoes LlamaModel.permute on the rows of `w` ([rows, ...], a weight or a bias):
/// w.reshape(n_head, rows / n_head / 2, 2, ...).transpose(1, 2).reshape(w.shape), transformers'
/// reverse_permute_weights. An Error when rows is not a multiple of 2 * n_head.
torch::Tensor gguf_unpermute_qk_rows(const torch::Tensor& w, std::int64_t n_head, const std::string& what);

}  // namespace refit
