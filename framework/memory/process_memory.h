#pragma once
// The process's own memory as the kernel counts it: what a user's machine must have. Reported
// after the models are built and at the end of `refit train` (the big-model paths: a frozen base
// built, loaded and quantized without a float32 copy; docs/quantization.md), and estimated by
// `refit inspect` before a run.
#include <cstdint>
#include <optional>

namespace refit {

/// The peak resident set size of this process so far, in bytes (getrusage's ru_maxrss).
std::int64_t peak_rss_bytes();

/// The resident set size of this process now, in bytes (/proc/self/statm); nullopt where the
/// kernel does not say.
std::optional<std::int64_t> resident_bytes();

/// The memory a new allocation can take on this machine without swapping: the kernel's
/// MemAvailable (/proc/meminfo), or less where a cgroup limit leaves less; nullopt where neither
/// is known.
std::optional<std::int64_t> available_bytes();

}  // namespace refit
