#include "quant/gguf_blocks.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "refit/error.h"

namespace refit::quant {

namespace {

std::int64_t row_bytes(const GgufBlocks& b) {
  const auto layout = io::gguf_block_layout(b.type);
  return b.shape[1] / static_cast<std::int64_t>(layout->elements) * static_cast<std::int64_t>(layout->bytes);
}

/// The fp16 value in bytes [at, at + 2) of each block of `v` [rows, blocks, block bytes], as
/// float32 [rows, blocks, 1] (little-endian, as GGUF stores it and as x86 and CUDA read it).
torch::Tensor fp16_field(const torch::Tensor& v, std::int64_t at) {
  return v.narrow(2, at, 2).contiguous().view(torch::kHalf).to(torch::kFloat);
}

/// The 32 nibbles of each block's 16 bytes from `at`, as float32 [rows, blocks, 32] minus
/// `minus`: element j < 16 the low nibble of byte j, element j + 16 its high nibble.
torch::Tensor nibbles(const torch::Tensor& v, std::int64_t at, int minus) {
  const auto qs = v.narrow(2, at, 16).to(torch::kInt);
  return torch::cat({qs.bitwise_and(15), qs.bitwise_right_shift(4)}, 2).sub(minus).to(torch::kFloat);
}

}  // namespace

bool gguf_blocks_supported(io::GgufType type) {
  return type == io::GgufType::Q4_0 || type == io::GgufType::Q4_1 || type == io::GgufType::Q8_0;
}

void check_gguf_blocks(const GgufBlocks& b) {
  if (!gguf_blocks_supported(b.type))
    throw Error("GGUF type " + io::gguf_type_name(b.type) +
                " is not kept as blocks (\"dtype\": \"gguf\" keeps Q4_0, Q4_1 and Q8_0)");
  if (b.shape.size() != 2 || b.shape[0] <= 0 || b.shape[1] <= 0 || b.shape[1] % 32 != 0)
    throw Error("GGUF " + io::gguf_type_name(b.type) + " blocks need a 2-D weight whose rows are whole blocks of 32");
  if (!b.blocks.defined() || b.blocks.scalar_type() != torch::kUInt8 || b.blocks.dim() != 2 ||
      b.blocks.size(0) != b.shape[0] || b.blocks.size(1) != row_bytes(b))
    throw Error("GGUF " + io::gguf_type_name(b.type) + " blocks of a [" + std::to_string(b.shape[0]) + ", " +
                std::to_string(b.shape[1]) + "] weight must be uint8 [" + std::to_string(b.shape[0]) + ", " +
                std::to_string(row_bytes(b)) + "]");
}

torch::Tensor dequantize_gguf_blocks_portable(const GgufBlocks& b, c10::ScalarType dtype) {
  check_gguf_blocks(b);
  const std::int64_t rows = b.shape[0], cols = b.shape[1];
  const auto layout = io::gguf_block_layout(b.type);
  const auto v = b.blocks.contiguous().view({rows, cols / 32, static_cast<std::int64_t>(layout->bytes)});
  torch::Tensor values;
  switch (b.type) {
    case io::GgufType::Q8_0:  // d * q
      values = v.narrow(2, 2, 32).contiguous().view(torch::kChar).to(torch::kFloat) * fp16_field(v, 0);
      break;
    case io::GgufType::Q4_0:  // d * (q - 8)
      values = fp16_field(v, 0) * nibbles(v, 2, 8);
      break;
    default:  // Q4_1: d * q + m (d * q is exact in fp32: the sum rounds once, fused or not)
      values = fp16_field(v, 0) * nibbles(v, 4, 0) + fp16_field(v, 2);
      break;
  }
  return values.reshape({rows, cols}).to(dtype);
}

torch::Tensor dequantize_gguf_blocks(const GgufBlocks& b, c10::ScalarType dtype) {
  check_gguf_blocks(b);
  if (!b.blocks.device().is_cpu()) return dequantize_gguf_blocks_portable(b, dtype);
  const bool direct = dtype == torch::kFloat || dtype == torch::kBFloat16;
  const std::int64_t rows = b.shape[0], cols = b.shape[1], stride = row_bytes(b);
  const torch::Tensor blocks = b.blocks.contiguous();
  torch::Tensor out = torch::empty({rows, cols}, torch::TensorOptions().dtype(direct ? dtype : torch::kFloat));
  const std::uint8_t* src = blocks.const_data_ptr<std::uint8_t>();
  // About 64 KB of output a task.
  const std::int64_t grain = std::max<std::int64_t>(1, 16384 / cols);
  at::parallel_for(0, rows, grain, [&](std::int64_t begin, std::int64_t end) {
    if (out.scalar_type() == torch::kFloat) {
      float* dst = out.data_ptr<float>();
      for (std::int64_t r = begin; r < end; ++r) io::gguf_dequantize_row(b.type, src + r * stride, dst + r * cols, cols);
      return;
    }
    std::vector<float> row(static_cast<std::size_t>(cols));
    c10::BFloat16* dst = out.data_ptr<c10::BFloat16>();
    for (std::int64_t r = begin; r < end; ++r) {
      io::gguf_dequantize_row(b.type, src + r * stride, row.data(), cols);
      // Round to nearest even (a NaN to 0x7FC0), as GgufFile::dequantize_bf16 and c10's cast.
      for (std::int64_t j = 0; j < cols; ++j) dst[r * cols + j] = c10::BFloat16(row[static_cast<std::size_t>(j)]);
    }
  });
  return direct ? out : out.to(dtype);
}

}  // namespace refit::quant
