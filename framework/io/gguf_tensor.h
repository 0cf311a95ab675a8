#pragma once
// GGUF tensors as torch tensors: the reader (gguf.h) dequantizes straight into the tensor's
// storage, so a bf16 tensor is never held in float32 first.
#include <string>

#include <torch/types.h>

#include "io/gguf.h"

namespace refit::io {

/// A CPU tensor of `dtype` (float32 or bfloat16 directly; another floating dtype through a
/// float32 copy of this one tensor) holding tensor `name` of `f` dequantized, in torch's shape.
/// An Error naming the file and the tensor for a type refit cannot dequantize or a dtype that is
/// not floating point.
torch::Tensor load_gguf_tensor(const GgufFile& f, const std::string& name, c10::ScalarType dtype);

}  // namespace refit::io
