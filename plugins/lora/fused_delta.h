#pragma once
// The LoRA delta of a Linear layer, B(A(x)) * scaling, as one autograd node.
//
// Written op by op (two at::linear calls, a scaling multiply, autocast's casts of A and B) the
// delta costs seven autograd nodes per layer: two ToCopy, two T, two Mm and a Mul. Each is a
// dispatch, an allocation and, on a CPU, often a thread wake-up. Here the forward and backward
// issue exactly the matrix products PyTorch's autograd would (same operands, same layouts, same
// dtypes), so the results are the op-by-op path's, bit for bit (tests/unit/test_lora.cpp checks
// it), with one node and no transposes, casts or multiplies that change nothing (scaling == 1).
#include <torch/types.h>

namespace refit::lora {

/// delta(x) = (x A^T) B^T * scaling for x of shape [..., in]. The compute dtype is autocast's when
/// autocast is on for x's device, else A's (x is cast to it, as the op-by-op path does).
torch::Tensor fused_linear_delta(const torch::Tensor& x, const torch::Tensor& lora_A, const torch::Tensor& lora_B,
                                 double scaling);

}  // namespace refit::lora
