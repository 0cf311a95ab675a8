#pragma once
// Per-shape choice between LibTorch's native bf16 kernel and the fp32 route for one CPU bf16
// product (precision/bf16_products.h), decided by timing both the first time a shape class
// occurs, then kept for the process.
//
// Why per shape: on a CPU with native bf16 kernels (AVX512-BF16, AMX) oneDNN's bf16 path has a
// fixed cost per call that a large product hides and a small one does not. The quickstart's
// 64-wide products trained at half the speed through native bf16 on an AMX Xeon that a 128^3
// probe called fast; MiniLM's 384-wide ones gained. No single answer per process is right.
//
// The policy is separate from the kernels so that it is tested without them: the caller gives,
// per call, the product's shape class and two callables that each run the product once (one per
// kernel); the first call of a class times each `reps` times after `warmups` calls (the fp32
// route first), on the call's own operands (the results are discarded), and the fp32 route is
// chosen when its fastest run beats the native kernel's fastest. Every call of a decided class runs the decided
// kernel only; the caller then computes the real result with it, so a run's numbers depend on
// the decisions alone — both are bf16 products, rounded once (docs/precision.md).
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace refit::precision {

/// A product's shape class: its operator and its operands' sizes, each rounded up to a power of
/// two ("mm 64x64 64x256": a [37, 50] by [50, 200] product): shapes within a factor of two share a decision (text padded to varying
/// lengths does not time every length).
/// `layouts`, one per operand when given, is appended to its sizes: 't' for a transposed view of a
/// contiguous matrix (the last two dimensions swapped), 's' for any other non-contiguous
/// operand, nothing for a contiguous one ("mm 8x4096t 4096x128"): a native kernel's speed on a
/// transposed or strided operand differs from its speed on a contiguous one, and the backward
/// multiplies the forward's operands transposed.
std::string shape_class(const std::string& op, const std::vector<std::vector<std::int64_t>>& operand_sizes,
                        const std::string& layouts = "");

struct ShapeRoutingOptions {
  int warmups = 1;  // untimed calls of each kernel first (oneDNN builds its primitive on the first)
  int reps = 3;     // timed calls of each; the fastest counts (robust to a preempted run)
  // The native kernel is given up after its first (warm-up) call when that call alone took
  // longer than both `give_up_ratio` x the fp32 route's fastest and `give_up_seconds`: LibTorch's
  // scalar bf16 fallback (a CPU without native bf16) is 30-100x slower on a large product, and
  // timing it `reps` more times would cost seconds per class. The floor keeps a small product's
  // one-time primitive creation (oneDNN, ~1 ms) from looking slow.
  double give_up_ratio = 16;
  double give_up_seconds = 2e-3;
  std::function<double()> clock;  // seconds; default: the steady clock (the products use every intra-op thread)
  // A file that keeps the decisions for every process on this machine ("": none). A class it
  // holds is not timed again: the first process to meet a class decides it for all later ones
  // (under a lock file beside it, so concurrent processes agree too), which makes two runs of one
  // recipe — a run and its resume, say — compute with the same kernels, bit for bit.
  std::string store;
};

struct ShapeDecision {
  std::string shape_class;
  bool fp32 = false;          // the fp32 route, else the native bf16 kernel
  double native_seconds = 0;  // fastest timed call of each (native: its warm-up when given up)
  double fp32_seconds = 0;
  bool native_given_up = false;  // the native kernel's warm-up alone ruled it out
  bool from_store = false;       // decided by an earlier process (ShapeRoutingOptions::store)
  std::int64_t calls = 0;        // calls of this class so far
};

/// The decisions a store file holds, by shape class; empty for a missing, unreadable or damaged
/// file (which the next decision rewrites whole).
std::map<std::string, ShapeDecision> read_shape_store(const std::string& path);
/// Writes `decisions` to `path` whole: a temporary file renamed over it.
void write_shape_store(const std::string& path, const std::map<std::string, ShapeDecision>& decisions);

class ShapeRouting {
 public:
  explicit ShapeRouting(ShapeRoutingOptions options = {});

  /// Whether this call goes through the fp32 route. The first call of `shape_class` times
  /// `run_native` and `run_fp32` (each runs the product once); later calls only look up.
  bool route_fp32(const std::string& shape_class, const std::function<void()>& run_native,
                  const std::function<void()>& run_fp32);

  const std::string& store() const { return options_.store; }

  /// The decisions so far, by shape class.
  std::vector<ShapeDecision> decisions() const;

 private:
  /// The fastest of `reps` timed calls after the warm-ups; `give_up_after` > 0: stop after the
  /// first warm-up if it took longer (returning its time, `gave_up` set).
  double fastest(const std::function<void()>& run, double give_up_after = 0, bool* gave_up = nullptr) const;
  ShapeDecision measure(const std::string& shape_class, const std::function<void()>& run_native,
                        const std::function<void()>& run_fp32) const;

  ShapeRoutingOptions options_;
  mutable std::recursive_mutex mutex_;  // recursive: a kernel timed may dispatch products of its own (a convolution's)
  std::map<std::string, ShapeDecision> decided_;
  int store_depth_ = 0;  // nested decisions inside a timing on this thread (under mutex_)
};

}  // namespace refit::precision
