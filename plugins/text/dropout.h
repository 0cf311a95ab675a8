#pragma once
// Dropout with its mask drawn in bulk (CPU). ATen's CPU dropout draws its Bernoulli mask one
// element at a time from the CPU generator (aten::bernoulli_): 29 % of the MiniLM LoRA step.
// This one draws the mask from a counter-based generator (Philox4x32-10, as CUDA's fused
// dropout), seeded by one draw from the default CPU generator, so a run stays reproducible and
// resumable from the generator's state, in parallel. Keeps each element with probability 1 - p
// (to 2^-32) and scales kept ones by 1 / (1 - p) in the input's dtype, as at::dropout does.
#include <cstdint>

#include <torch/types.h>

namespace refit::text {

/// `x * mask / (1 - p)` with a fresh Bernoulli(1 - p) mask; on other devices, at::dropout.
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

/// One Philox4x32-10 block: four 32-bit words for a 128-bit counter and a 64-bit key. Exposed
/// for tests (Random123's known-answer vectors).
void philox4x32_10(const std::uint32_t counter[4], const std::uint32_t key[2], std::uint32_t out[4]);

}  // namespace refit::text
