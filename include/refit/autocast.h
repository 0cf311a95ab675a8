#pragma once
// Part of the SDK: objectives and evaluators in plugins use it too (a loss computed in float32
// inside a mixed-precision forward: AutocastGuard(device, dtype, false)).
// RAII autocast for one device type on the current thread (autocast state is thread-local:
// construct it on the thread that runs the forward). Restores the previous state on exit and
// clears the cast cache when the outermost guard closes, like torch.autocast.
#include <ATen/autocast_mode.h>

namespace refit {

class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled)
      : device_(device), previous_enabled_(at::autocast::is_autocast_enabled(device)),
        previous_dtype_(at::autocast::get_autocast_dtype(device)) {
    at::autocast::set_autocast_enabled(device_, enabled);
    at::autocast::set_autocast_dtype(device_, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, previous_enabled_);
    at::autocast::set_autocast_dtype(device_, previous_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

/// Autocast off for `device` in this scope (float32 reductions inside an autocast forward: a
/// matmul-shaped loss would otherwise run in bf16/fp16).
class AutocastOff : public AutocastGuard {
 public:
  explicit AutocastOff(c10::DeviceType device) : AutocastGuard(device, at::autocast::get_autocast_dtype(device), false) {}
};

}  // namespace refit
