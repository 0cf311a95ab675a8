#pragma once
// GGUF Q4_1 blocks for the quantized-layer tests (unit and gpu), in place of a file's.
#include <cstdint>

#include <torch/utils.h>
#include <torch/types.h>

#include "quant/gguf_blocks.h"

namespace refit::test {

/// Q4_1 blocks of a [rows, cols] weight: random nibbles, each block's scale and minimum fp16
/// values of a trained weight's size (d in [0.002, 0.01], m in [-0.08, -0.02]).
inline quant::GgufBlocks synthetic_q4_1(std::int64_t rows, std::int64_t cols) {
  torch::manual_seed(11);
  const std::int64_t blocks = rows * cols / 32;
  const torch::Tensor d = (torch::rand({blocks, 1}) * 0.008 + 0.002).to(torch::kHalf);
  const torch::Tensor m = (torch::rand({blocks, 1}) * 0.06 - 0.08).to(torch::kHalf);
  const torch::Tensor qs = torch::randint(0, 256, {blocks, 16}, torch::kUInt8);
  const torch::Tensor packed = torch::cat({d.view(torch::kUInt8), m.view(torch::kUInt8), qs}, 1);
  return {io::GgufType::Q4_1, packed.reshape({rows, cols / 32 * 20}).contiguous(), {rows, cols}};
}

}  // namespace refit::test
