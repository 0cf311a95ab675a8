#pragma once
// Cross-entropy of a linear layer's outputs computed a chunk of rows at a time, so that the
// [rows x classes] logits are never held at once: a language model's 4,096 tokens x 49,152-word
// vocabulary would be 805 MB of fp32 logits (and as much again for their gradient); chunks of
// 512 rows hold 100 MB. The backward recomputes each chunk's logits from the saved inputs
// (torchtune's LinearCrossEntropyLoss and Liger's fused linear cross-entropy do the same).
//
// Numbers: each chunk's logits are `hidden @ weight^T` in `compute_dtype` (the autocast dtype
// when the caller runs under autocast, as the unchunked matmul would be), then upcast to fp32
// for log-sum-exp, exactly the ops of `cross_entropy(logits.float(), targets)` on those rows;
// the chunked and the unchunked loss differ only in the order of the final sum.
#include <cstdint>

#include <torch/types.h>

namespace refit {

struct ChunkedCrossEntropyResult {
  torch::Tensor loss_sum;  // 0-d fp32: sum over rows whose target is not ignore_index
  torch::Tensor correct;   // 0-d fp32: rows whose argmax equals the target (no gradient)
};

/// hidden [N, H], weight [V, H], targets [N] int64 (ignore_index rows count nothing). Gradients
/// flow to `hidden` and, when it requires them, to `weight`.
ChunkedCrossEntropyResult chunked_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                       const torch::Tensor& targets, std::int64_t chunk_rows,
                                                       c10::ScalarType compute_dtype, std::int64_t ignore_index = -100);

}  // namespace refit
