#pragma once
// Quantizing a dense weight into the formats of refit/quantized.h, with bitsandbytes 0.50.2's
// arithmetic on the CPU (the golden test compares bytes): its quantize_4bit (NF4: the block
// scaled by the reciprocal of its maximum, the nearest code by midpoints, a tie to the lower
// code), its native quantize_blockwise for the double quantization (the scaled value through a
// 65,536-point grid to its code), and int8_vectorwise_quant.
#include <cstdint>

#include <torch/types.h>

#include "refit/quantized.h"

namespace refit::quant {

struct Nf4Options {
  std::int64_t blocksize = 64;          // a power of two in [16, 4096], as bitsandbytes allows
  bool double_quantization = false;     // compress_statistics
  std::int64_t absmax_blocksize = 256;  // the block maxima's own blocks (bitsandbytes: 256)
};

/// `weight` (any float dtype, any shape, finite) in NF4. Throws refit::Error for a non-finite
/// value or an invalid block size.
Nf4Weight quantize_nf4(const torch::Tensor& weight, const Nf4Options& options = {});

/// `weight` [rows, cols] (finite) in the row-wise int8 format.
Int8Weight quantize_int8(const torch::Tensor& weight);

}  // namespace refit::quant
