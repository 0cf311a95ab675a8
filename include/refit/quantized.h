#pragma once
// Quantized storage of frozen weights, bit for bit as bitsandbytes 0.50.2 stores them (its CPU
// functions are the reference: tests/golden/make_quantized.py):
//
//   NF4   4-bit NormalFloat (QLoRA): the flattened weight in blocks of 64, each block scaled by its
//         absolute maximum (float32) and every value replaced by the index of the nearest of the 16
//         NF4 code values; two indices a byte, the first element in the high nibble. With double
//         quantization the block maxima are themselves stored in 8 bits: their mean (offset)
//         subtracted, in blocks of 256 scaled by their own absolute maximum, each the index of the
//         nearest value of the signed dynamic 8-bit map.
//   int8  LLM.int8()'s row-wise weight-only format: each output row scaled by its absolute maximum
//         / 127 and rounded to the nearest integer (ties to even).
//
// Dequantization is here, in LibTorch operations (any device), for the layers that hold such a
// weight; quantization runs where the framework applies a model's declared storage.
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace refit::quant {

/// bitsandbytes' get_4bit_type("nf4"): the 16 NF4 values, ascending.
inline const std::array<float, 16>& nf4_code() {
  static const std::array<float, 16> code{
      -0x1p+0f,        -0x1.647362p-1f, -0x1.0cd66p-1f, -0x1.94654p-2f, -0x1.23449ap-2f, -0x1.7a6a7ep-3f,
      -0x1.74f0e2p-4f, 0x0p+0f,         0x1.45f5fep-4f, 0x1.4995c6p-3f, 0x1.f809bap-3f,  0x1.5a0674p-2f,
      0x1.c3497p-2f,   0x1.200f56p-1f,  0x1.722766p-1f, 0x1p+0f,
  };
  return code;
}

/// bitsandbytes' create_dynamic_map(signed=True): the 256 values of the signed dynamic 8-bit map,
/// ascending (the double quantization of NF4's block maxima).
inline const std::array<float, 256>& dynamic_code() {
  static const std::array<float, 256> code{
      -0x1.fc6666p-1f,  -0x1.f53334p-1f,  -0x1.eep-1f,      -0x1.e6ccccp-1f,  -0x1.df999ap-1f,  -0x1.d86666p-1f,
      -0x1.d13334p-1f,  -0x1.cap-1f,      -0x1.c2ccccp-1f,  -0x1.bb999ap-1f,  -0x1.b46666p-1f,  -0x1.ad3334p-1f,
      -0x1.a6p-1f,      -0x1.9eccccp-1f,  -0x1.97999ap-1f,  -0x1.906666p-1f,  -0x1.893334p-1f,  -0x1.82p-1f,
      -0x1.7accccp-1f,  -0x1.73999ap-1f,  -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5ep-1f,      -0x1.56ccccp-1f,
      -0x1.4f999ap-1f,  -0x1.486668p-1f,  -0x1.413334p-1f,  -0x1.3ap-1f,      -0x1.32ccccp-1f,  -0x1.2b999ap-1f,
      -0x1.246668p-1f,  -0x1.1d3334p-1f,  -0x1.16p-1f,      -0x1.0eccccp-1f,  -0x1.079998p-1f,  -0x1.006666p-1f,
      -0x1.f26664p-2f,  -0x1.e4p-2f,      -0x1.d59998p-2f,  -0x1.c73334p-2f,  -0x1.b8ccccp-2f,  -0x1.aa6666p-2f,
      -0x1.9cp-2f,      -0x1.8d9998p-2f,  -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626666p-2f,  -0x1.54p-2f,
      -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,  -0x1.0cp-2f,      -0x1.fb3332p-3f,
      -0x1.de6666p-3f,  -0x1.c1999ap-3f,  -0x1.a4ccccp-3f,  -0x1.88p-3f,      -0x1.6b3334p-3f,  -0x1.4e6666p-3f,
      -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.fp-4f,       -0x1.b66668p-4f,  -0x1.93d70ap-4f,  -0x1.8851eep-4f,
      -0x1.7ccccep-4f,  -0x1.7147aep-4f,  -0x1.65c29p-4f,   -0x1.5a3d7p-4f,   -0x1.4eb854p-4f,  -0x1.433334p-4f,
      -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,  -0x1.09999ap-4f,  -0x1.fc28f6p-5f,
      -0x1.e51ebap-5f,  -0x1.ce147ap-5f,  -0x1.b70a3ep-5f,  -0x1.ap-5f,       -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
      -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c29p-5f,   -0x1.fd70a4p-6f,  -0x1.cf5c2ap-6f,
      -0x1.a147aep-6f,  -0x1.733334p-6f,  -0x1.451ebap-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c29p-7f,
      -0x1.3e76c8p-7f,  -0x1.2c083p-7f,   -0x1.19999ap-7f,  -0x1.072b02p-7f,  -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,
      -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,  -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
      -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f,
      -0x1.78d5p-11f,   -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
      -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f, -0x1.b43528p-19f,
      -0x1.27476ep-21f, 0x0p+0f,          0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
      0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,  0x1.19ce0ap-12f,  0x1.8fc506p-12f,
      0x1.02de02p-11f,  0x1.3dd982p-11f,  0x1.78d5p-11f,    0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
      0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,   0x1.0c49bap-8f,   0x1.3126e8p-8f,
      0x1.56041ap-8f,   0x1.7ae148p-8f,   0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
      0x1.19999ap-7f,   0x1.2c083p-7f,    0x1.3e76c8p-7f,   0x1.75c29p-7f,    0x1.d1eb86p-7f,   0x1.170a3ep-6f,
      0x1.451ebap-6f,   0x1.733334p-6f,   0x1.a147aep-6f,   0x1.cf5c2ap-6f,   0x1.fd70a4p-6f,   0x1.15c29p-5f,
      0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,   0x1.88f5c2p-5f,   0x1.ap-5f,
      0x1.b70a3ep-5f,   0x1.ce147ap-5f,   0x1.e51ebap-5f,   0x1.fc28f6p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
      0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,   0x1.4eb854p-4f,   0x1.5a3d7p-4f,
      0x1.65c29p-4f,    0x1.7147aep-4f,   0x1.7ccccep-4f,   0x1.8851eep-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
      0x1.fp-4f,        0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,   0x1.6b3334p-3f,   0x1.88p-3f,
      0x1.a4ccccp-3f,   0x1.c1999ap-3f,   0x1.de6666p-3f,   0x1.fb3332p-3f,   0x1.0cp-2f,       0x1.1a6668p-2f,
      0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.54p-2f,       0x1.626666p-2f,   0x1.70ccccp-2f,
      0x1.7f3334p-2f,   0x1.8d9998p-2f,   0x1.9cp-2f,       0x1.aa6666p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
      0x1.d59998p-2f,   0x1.e4p-2f,       0x1.f26664p-2f,   0x1.006666p-1f,   0x1.079998p-1f,   0x1.0eccccp-1f,
      0x1.16p-1f,       0x1.1d3334p-1f,   0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3ap-1f,
      0x1.413334p-1f,   0x1.486668p-1f,   0x1.4f999ap-1f,   0x1.56ccccp-1f,   0x1.5ep-1f,       0x1.653334p-1f,
      0x1.6c6668p-1f,   0x1.73999ap-1f,   0x1.7accccp-1f,   0x1.82p-1f,       0x1.893334p-1f,   0x1.906666p-1f,
      0x1.97999ap-1f,   0x1.9eccccp-1f,   0x1.a6p-1f,       0x1.ad3334p-1f,   0x1.b46666p-1f,   0x1.bb999ap-1f,
      0x1.c2ccccp-1f,   0x1.cap-1f,       0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df999ap-1f,   0x1.e6ccccp-1f,
      0x1.eep-1f,       0x1.f53334p-1f,   0x1.fc6666p-1f,   0x1p+0f,
  };
  return code;
}

/// A weight in NF4.
struct Nf4Weight {
  torch::Tensor packed;        // uint8 [ceil(numel / 2)]
  torch::Tensor absmax;        // float32 [blocks]; with double quantization uint8 [blocks]
  torch::Tensor absmax_scale;  // double quantization: float32 [ceil(blocks / absmax_blocksize)]
  float offset = 0;            // double quantization: the mean of the block maxima
  std::vector<std::int64_t> shape;
  std::int64_t blocksize = 64, absmax_blocksize = 256;

  bool double_quantized() const { return absmax.defined() && absmax.scalar_type() == torch::kUInt8; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  /// The bytes it holds: what replaces numel * sizeof(dtype) of the dense weight.
  std::int64_t bytes() const {
    std::int64_t b = packed.numel() + absmax.numel() * static_cast<std::int64_t>(absmax.element_size());
    if (absmax_scale.defined()) b += absmax_scale.numel() * 4 + 4;
    return b;
  }
};

/// The block maxima of `q` in float32 [blocks] (double quantization undone: code[i] * scale +
/// offset, as bitsandbytes' dequantize_blockwise and the addition of the offset compute them).
inline torch::Tensor nf4_block_maxima(const Nf4Weight& q) {
  if (!q.double_quantized()) return q.absmax;
  const auto& d = dynamic_code();
  const torch::Tensor code = torch::from_blob(const_cast<float*>(d.data()), {256}, torch::kFloat).to(q.absmax.device());
  const std::int64_t blocks = q.absmax.numel();
  const torch::Tensor scale =
      q.absmax_scale.repeat_interleave(q.absmax_blocksize).narrow(0, 0, blocks);  // each block's scale
  return code.index({q.absmax.to(torch::kLong)}) * scale + q.offset;
}

/// The dense weight of `q` in `dtype`: code[index] * block maximum in float32, then cast (as
/// bitsandbytes' dequantize_4bit).
inline torch::Tensor dequantize_nf4(const Nf4Weight& q, c10::ScalarType dtype = torch::kFloat) {
  const auto& c = nf4_code();
  const torch::Tensor code = torch::from_blob(const_cast<float*>(c.data()), {16}, torch::kFloat).to(q.packed.device());
  const std::int64_t n = q.numel();
  const torch::Tensor bytes = q.packed.to(torch::kLong);
  const torch::Tensor indices = torch::stack({bytes.bitwise_right_shift(4), bytes.bitwise_and(15)}, 1).reshape(-1);
  torch::Tensor values = code.index({indices.narrow(0, 0, n)});
  const torch::Tensor maxima = nf4_block_maxima(q);
  const std::int64_t full = n / q.blocksize * q.blocksize;
  torch::Tensor out =
      values.narrow(0, 0, full).view({-1, q.blocksize}) * maxima.narrow(0, 0, full / q.blocksize).unsqueeze(1);
  out = out.reshape(-1);
  if (full < n) out = torch::cat({out, values.narrow(0, full, n - full) * maxima[full / q.blocksize]});
  return out.view(q.shape).to(dtype);
}

/// A weight in LLM.int8()'s row-wise format.
struct Int8Weight {
  torch::Tensor weight;  // int8 [rows, cols]
  torch::Tensor scale;   // float32 [rows]: each row's absolute maximum
  std::int64_t bytes() const { return weight.numel() + scale.numel() * 4; }
};

/// weight * scale / 127 in float32 (as bitsandbytes' int8_vectorwise_dequant: times the row's
/// maximum, then times 1/127 rounded to float), cast to `dtype`.
inline torch::Tensor dequantize_int8(const Int8Weight& q, c10::ScalarType dtype = torch::kFloat) {
  return (q.weight.to(torch::kFloat) * q.scale.view({-1, 1}) * 7.874015718698502e-3).to(dtype);
}

/// A frozen weight kept in a quantized format inside an adaptable layer (refit/layers.h,
/// AdaptableLayer::set_quantized_weight). The framework creates it when it applies a model's
/// declared storage ("dtype": "nf4" / "int8"); layers and adapters use it through this
/// interface only. Its packed tensors are the layer's buffers (they move with the module: the
// implementation must read them through the same tensor handles, whose data a move replaces).
class QuantizedWeight {
 public:
  virtual ~QuantizedWeight() = default;
  /// "nf4", "int8", or a GGUF block type kept as read: "q4_0", "q4_1", "q8_0".
  virtual std::string format() const = 0;
  /// The dense weight's shape ([out, in]).
  virtual std::vector<std::int64_t> shape() const = 0;
  /// The dtype products run in (the model's declared dtype: bfloat16 or float32).
  virtual c10::ScalarType compute_dtype() const = 0;
  /// The bytes the packed weight holds.
  virtual std::int64_t bytes() const = 0;
  /// The packed tensors, by name ("packed", "absmax", ...): the layer's buffers.
  virtual std::vector<std::pair<std::string, torch::Tensor>> tensors() const = 0;
  /// The dense weight in `dtype`, dequantized now (a new tensor each call).
  virtual torch::Tensor dequantize(c10::ScalarType dtype) const = 0;
  /// input W^T + bias, W dequantized in the compute dtype for the product only. Autograd reaches
  /// the input (and the bias, when it requires grad), never the weight, and keeps the packed
  /// weight for the backward, not a dense copy.
  virtual torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& bias) const = 0;
};

}  // namespace refit::quant
