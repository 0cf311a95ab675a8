#pragma once
// Quantized weights for the quantized-layer and few-row tests (unit and gpu): GGUF blocks in place
// of a file's, and a Linear's weight in each storage the tests run.
#include <cstdint>
#include <memory>
#include <string>

#include <torch/types.h>
#include <torch/utils.h>

#include "quant/gguf_blocks.h"
#include "quant/quantized_weight.h"

namespace refit::test {

/// Q4_0 / Q4_1 / Q8_0 blocks of a [rows, cols] weight: random quants, each block's fp16 scale
/// (and Q4_1's minimum) of a trained weight's size: d in [0.002, 0.01] (Q8_0: a tenth), m in
/// [-0.08, -0.02]; the first block's scale negative, as llama.cpp's Q4_0 and Q8_0 write some.
inline quant::GgufBlocks synthetic_gguf_blocks(io::GgufType type, std::int64_t rows, std::int64_t cols,
                                               std::uint64_t seed = 11) {
  torch::manual_seed(seed);
  const std::int64_t blocks = rows * cols / 32;
  torch::Tensor d = torch::rand({blocks, 1}) * 0.008 + 0.002;
  if (type == io::GgufType::Q8_0) d = d * 0.1;
  d[0][0] = -d[0][0];
  const torch::Tensor d16 = d.to(torch::kHalf).view(torch::kUInt8);
  torch::Tensor packed;
  if (type == io::GgufType::Q8_0) {
    packed = torch::cat({d16, torch::randint(0, 256, {blocks, 32}, torch::kUInt8)}, 1);
  } else {
    const torch::Tensor qs = torch::randint(0, 256, {blocks, 16}, torch::kUInt8);
    if (type == io::GgufType::Q4_0) {
      packed = torch::cat({d16, qs}, 1);
    } else {
      const torch::Tensor m = (torch::rand({blocks, 1}) * 0.06 - 0.08).to(torch::kHalf).view(torch::kUInt8);
      packed = torch::cat({d16, m, qs}, 1);
    }
  }
  return {type, packed.reshape({rows, -1}).contiguous(), {rows, cols}};
}

/// Q4_1 blocks (as a GGUF's projections).
inline quant::GgufBlocks synthetic_q4_1(std::int64_t rows, std::int64_t cols) {
  return synthetic_gguf_blocks(io::GgufType::Q4_1, rows, cols);
}

/// `dense` [96, 256] stored as `format`: "nf4" (blocks of 64, double quantization), "int8", or
/// "q4_1" (synthetic blocks of that shape: the dense values are not used).
inline std::shared_ptr<const quant::QuantizedWeight> quantized_weight_for(const std::string& format,
                                                                          const torch::Tensor& dense,
                                                                          c10::ScalarType compute) {
  if (format == "nf4") return quant::make_nf4_weight(dense, quant::Nf4Options{64, true, 256}, compute);
  if (format == "int8") return quant::make_int8_weight(dense, compute);
  return quant::make_gguf_weight(synthetic_q4_1(dense.size(0), dense.size(1)), compute);
}

}  // namespace refit::test
