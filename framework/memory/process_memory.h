#pragma once
// The process's own memory as the kernel counts it: what a user's machine must have. Reported
// after the models are built and at the end of `refit train` (the big-model paths: a frozen base
// built, loaded and quantized without a float32 copy; docs/quantization.md).
#include <cstdint>

namespace refit {

/// The peak resident set size of this process so far, in bytes (getrusage's ru_maxrss).
std::int64_t peak_rss_bytes();

}  // namespace refit
