#pragma once
// The framework's implementations of refit::quant::QuantizedWeight (refit/quantized.h): NF4,
// row-wise int8 and GGUF-block weights whose product with an input dequantizes the weight for that product
// only, forward and backward (a custom autograd function that saves the packed tensors).
#include <memory>

#include <torch/types.h>

#include "quant/gguf_blocks.h"
#include "quant/quantize.h"
#include "refit/quantized.h"

namespace refit::quant {

/// `dense` quantized to NF4, computing in `compute` (bfloat16, float16 or float32).
std::shared_ptr<QuantizedWeight> make_nf4_weight(const torch::Tensor& dense, const Nf4Options& options,
                                                 c10::ScalarType compute);
/// `dense` [out, in] quantized to row-wise int8, computing in `compute`.
std::shared_ptr<QuantizedWeight> make_int8_weight(const torch::Tensor& dense, c10::ScalarType compute);
/// A GGUF tensor's blocks kept as read (quant/gguf_blocks.h), computing in `compute`. Throws
/// refit::Error for a type other than Q4_0, Q4_1, Q8_0, or blocks that do not fit the shape.
std::shared_ptr<QuantizedWeight> make_gguf_weight(GgufBlocks blocks, c10::ScalarType compute);

}  // namespace refit::quant
