#pragma once
// Attention of one query per sequence over a KV cache: a decoding step's attention, in one pass.
//
// LibTorch's scaled_dot_product_attention serves a decoding step ([B, H, 1, D] queries against
// [B, KVH, L, D] cached keys) with its blocked flash kernel: on the CPU that is a GEMM call per
// block, a mask widened to the query's dtype, and (through refit's bf16 route, where it times
// faster) the whole cache widened to fp32 every step — about a fifth of SmolLM2's decoding step
// for a few hundred thousand multiply-adds (docs/performance.md, "Decoding"). This loop reads each
// cached key and value once, in place.
//
// Arithmetic: fp32 from the operands' values (bf16 widened exactly), the scores scaled by
// 1/sqrt(D), a softmax with the row maximum subtracted, the weighted sum of values divided by the
// softmax's sum, one rounding to the query's dtype — SDPA's fp32 route with its sums in another
// order. GQA: query head h reads key/value head h / (H / KVH), as transformers' repeat_kv.
#include <torch/types.h>

namespace refit::llm {

/// Whether one_query_attention takes these operands: q [B, H, 1, D], k and v [B, KVH, L, D] with
/// H a multiple of KVH, all on the CPU in one dtype (float32 or bfloat16) with unit stride in D;
/// `allowed` undefined or bool [B, 1, 1, L].
bool one_query_attention_fits(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& allowed);

/// softmax(q kᵀ / sqrt(D) where allowed, else -inf) v per head, as [B, H, 1, D] in q's dtype. A
/// row with no allowed key gives zeros. Throws refit::Error for operands the loop does not take.
torch::Tensor one_query_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& allowed = {});

}  // namespace refit::llm
