#pragma once
// Precision modes of a run (recipe key /training/precision). See docs/precision.md.
#include <c10/core/ScalarType.h>

namespace refit {

enum class Precision {
  fp32,        // everything fp32, no autocast
  bf16_mixed,  // autocast to bf16, no scaler (bf16 has fp32's exponent range)
  fp16_mixed,  // autocast to fp16 + gradient scaler
  bf16_true,   // no autocast; frozen and (explicitly) trainable weights may be bf16
};

const char* to_string(Precision p);

inline bool uses_autocast(Precision p) { return p == Precision::bf16_mixed || p == Precision::fp16_mixed; }
inline bool uses_grad_scaler(Precision p) { return p == Precision::fp16_mixed; }
inline c10::ScalarType autocast_dtype(Precision p) { return p == Precision::fp16_mixed ? c10::kHalf : c10::kBFloat16; }

}  // namespace refit
