#pragma once
// RMSNorm and the rotary embedding as one loop each, for forwards without gradients (decoding,
// evaluation, predict): the same elementwise arithmetic as their composite forms in llama.cpp,
// one LibTorch call instead of eight (RMSNorm) or seven (the rotation).
//
// A decoding step of SmolLM2 (30 layers, 8 rows) is about 3,000 small LibTorch calls; their fixed
// cost, not arithmetic, is most of the step outside the weight products (docs/performance.md,
// "Decoding"). The training forward keeps the composite forms, whose autograd gives the
// gradients.
//
// Rounding: as the composite, each operation rounds to the dtype of its result (bf16 operands
// are widened exactly, every product formed in fp32 and rounded once, never fused into an add).
// The one difference is RMSNorm's mean of squares: fp32 sums in another order (a relative
// difference of order 2^-24 sqrt(D) in the scale).
#include <torch/types.h>

namespace refit::llm {

/// Whether rms_norm_inference takes x [..., D] and weight [D]: one dtype (float32 or bfloat16),
/// on the CPU, contiguous.
bool rms_norm_inference_fits(const torch::Tensor& x, const torch::Tensor& weight);
/// weight * round(x / sqrt(mean(x^2) + eps)), mean and scale in fp32 (transformers' LlamaRMSNorm).
torch::Tensor rms_norm_inference(const torch::Tensor& x, const torch::Tensor& weight, double eps);

/// Whether rotate_inference takes x [B, H, T, D] and cos, sin [B, 1, T, D]: one dtype (float32 or
/// bfloat16), on the CPU, unit stride in D, D even.
bool rotate_inference_fits(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
/// x cos + rotate_half(x) sin, rotate_half([x1, x2]) = [-x2, x1]: a new contiguous [B, H, T, D].
torch::Tensor rotate_inference(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace refit::llm
