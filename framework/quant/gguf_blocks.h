#pragma once
// A frozen Linear weight kept in the blocks a GGUF file stores it in (Q4_0, Q4_1, Q8_0: llama.cpp's
// formats, 32 elements a block along each row with an fp16 scale, and an fp16 minimum for Q4_1), as
// read: "dtype": "gguf" (docs/quantization.md). No requantization, so the weight's values are the
// file's exactly, and the memory is the file's (4.5 to 8.5 bits a weight).
//
// Dequantization is gguf-py's arithmetic (io/gguf.h, gguf_dequantize_row): each element one
// float32 product (and one float32 sum for Q4_1), then rounded once to the compute dtype. On the
// CPU one pass over the rows; on other devices (CUDA) the same values from LibTorch operations.
#include <cstdint>
#include <vector>

#include <torch/types.h>

#include "io/gguf.h"
#include "refit/quantized.h"

namespace refit::quant {

/// A 2-D GGUF tensor's packed blocks: `blocks` uint8 [rows, row bytes], `shape` [rows, cols] in
/// torch order (cols a multiple of 32).
struct GgufBlocks {
  io::GgufType type = io::GgufType::Q8_0;
  torch::Tensor blocks;
  std::vector<std::int64_t> shape;
};

/// Whether a weight of this type is kept as blocks (Q4_0, Q4_1, Q8_0).
bool gguf_blocks_supported(io::GgufType type);

/// The dense weight [rows, cols] in `dtype` (any floating dtype; float32 and bfloat16 directly on
/// the CPU), bit for bit what GgufFile::dequantize / dequantize_bf16 give (a NaN, from a NaN
/// scale, as c10's scalar cast writes it: 0x7FC0 in bf16).
torch::Tensor dequantize_gguf_blocks(const GgufBlocks& b, c10::ScalarType dtype);

/// The same through LibTorch operations on any device (what dequantize_gguf_blocks runs off the
/// CPU): the fp16 scales reinterpreted from the bytes, the nibbles by shifts and masks. The same
/// values bit for bit but for a NaN's bit pattern in bf16 (torch's vectorised cast writes its own).
torch::Tensor dequantize_gguf_blocks_portable(const GgufBlocks& b, c10::ScalarType dtype);

/// Checks that `b` is a supported type whose blocks fit its shape; throws refit::Error saying what
/// does not.
void check_gguf_blocks(const GgufBlocks& b);

}  // namespace refit::quant
