#pragma once
// Dequantization on the CPU in one pass over the packed bytes, for the products of a quantized
// frozen base (quantized_weight.cpp dequantizes each layer's weight in its forward and again in
// its backward). The portable definitions in refit/quantized.h build the same values from LibTorch
// ops through int64 indices and float32 intermediates: about 17 bytes of temporaries per weight
// and several passes, which made an NF4 step on TinyLlama-1.1B's shape 2.3x the bf16 step and
// added ~200 MB to the peak. These write the result directly, bit for bit the same values
// (each value is code x maximum in float32, rounded once to the output dtype), tested against the
// portable path; any device other than the CPU, or a dtype other than float32 / bfloat16, uses it.
#include <torch/types.h>

#include "refit/quantized.h"

namespace refit::quant {

/// dequantize_nf4(q, dtype) (refit/quantized.h), on the CPU for float32 and bfloat16.
torch::Tensor dequantize_nf4_fast(const Nf4Weight& q, c10::ScalarType dtype);
/// dequantize_int8(q, dtype), on the CPU for float32 and bfloat16.
torch::Tensor dequantize_int8_fast(const Int8Weight& q, c10::ScalarType dtype);

}  // namespace refit::quant
