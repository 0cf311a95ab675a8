#include "io/gguf_tensor.h"

#include <ATen/ATen.h>

#include "refit/error.h"

namespace refit::io {

torch::Tensor load_gguf_tensor(const GgufFile& f, const std::string& name, c10::ScalarType dtype) {
  const GgufTensorInfo& info = f.info(name);
  if (!c10::isFloatingType(dtype))
    throw Error(f.label() + ": tensor \"" + name + "\" cannot be loaded as " + c10::toString(dtype) +
                " (GGUF tensors dequantize to floating point)");
  const auto options = torch::TensorOptions().dtype(dtype == c10::kBFloat16 ? c10::kBFloat16 : c10::kFloat);
  auto t = torch::empty(info.shape, options);
  if (dtype == c10::kBFloat16) {
    static_assert(sizeof(c10::BFloat16) == sizeof(std::uint16_t), "bf16 is 16 bits");
    f.dequantize_bf16(name, reinterpret_cast<std::uint16_t*>(t.data_ptr<c10::BFloat16>()));
    return t;
  }
  f.dequantize(name, t.data_ptr<float>());
  return dtype == c10::kFloat ? t : t.to(dtype);
}

}  // namespace refit::io
