#pragma once
// bf16 products on CPUs without fast bf16 kernels.
//
// A frozen bf16 backbone spends its step in matrix products and convolutions. Where the CPU has
// no native bf16 arithmetic (AVX2-only x86: no AVX512-BF16, no AMX), LibTorch's bf16 products
// fall back to scalar loops: ~100x slower than the same product in fp32 on the same CPU. A bf16
// kernel's arithmetic is: widen the bf16 operands to fp32 (exact), multiply-accumulate in fp32,
// round the result once to bf16. The fp32 kernels do the same arithmetic once the operands are
// widened, so refit can route a CPU bf16 product through them:
//
//   result = round_to_bf16( fp32_kernel( widen(a), widen(b) ) )
//
// Which side is faster depends on the shape as much as on the CPU (oneDNN's native bf16 kernels
// have a fixed cost per call; widening a large operand costs memory traffic), so by default each
// product shape class takes the side that was faster when it was timed (precision/shape_routing.h).
//
// The route is a CPU-dispatch-key kernel for each product operator (mm, addmm, bmm, baddbmm and
// their out/in-place forms, convolution and its backward, the CPU flash-attention forward and
// backward). It sits below autograd and autocast, so it serves autocast's casts, frozen bf16
// weights outside autocast, the products autograd's formulas call in the backward, and every
// plugin's own at::mm — with nothing saved for the backward but the bf16 tensors themselves
// (memory is the point of freezing in bf16). Calls whose operands are not all bf16 go to
// LibTorch's own CPU kernel unchanged (the same function the dispatcher would have called).
//
// What can differ from a native bf16 kernel: the order of the fp32 accumulation (blocking), the
// treatment of subnormal bf16 inputs (AVX512-BF16/AMX dot products flush them; fp32 FMA keeps
// them), and in flash attention the internal roundings of the attention weights (the native bf16
// kernel rounds the softmax probabilities to bf16 before the second product; the route keeps
// them in fp32). docs/precision.md states it with the tests that bound it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "precision/shape_routing.h"

namespace refit::precision {

/// How this process computes bf16 products on the CPU, decided once.
struct Bf16Products {
  bool native = true;          // LibTorch's bf16 kernels are used as they are (no route)
  bool routed = false;         // the fp32 route is installed for every bf16 product
  bool per_shape = false;      // the route is installed and chooses per shape class, by timing
                               // both kernels the first time a class occurs (precision/shape_routing.h)
  std::string decided_by;      // "auto" or "REFIT_BF16_PRODUCTS=<value>"
  std::string cpu_capability;  // ATen's vector ISA in use ("AVX512", "AVX2", ...)
  std::string route_error;     // why the route could not be installed (then native), or ""
  std::string shape_store;     // per_shape: the file that keeps the decisions ("" = none)
  /// One line for the run header, `refit --version` and the report:
  /// "per product shape, the faster of the native bf16 kernel and the fp32 route, timed on first
  /// use (bf16/fp32 matmul time 19.9x, auto; ATen AVX2); decisions kept in <file>" or
  /// "fp32 kernels, results rounded to bf16 (REFIT_BF16_PRODUCTS=fp32; ATen AVX512)".
  std::string describe() const;
};

/// Decides (once per process) how CPU bf16 products run, and installs the route; later calls
/// return the same decision. The environment variable REFIT_BF16_PRODUCTS chooses:
///  * "auto" (default): per product shape class (precision/shape_routing.h), the faster of
///    LibTorch's native bf16 kernel and the fp32 route, timed the first time the class occurs on
///    this machine and kept in a file for every later process (REFIT_BF16_PRODUCTS_CACHE: the
///    folder, default ~/.cache/refit, or "off"); a 128^3 probe's bf16/fp32 time ratio is reported beside it;
///  * "native" or "fp32": every bf16 product through one side.
/// Any other value throws. Call it before the first forward (the CLI and the test and benchmark
/// programs do it first).
const Bf16Products& configure_bf16_products();

/// The per-shape decisions made so far in this process (empty unless per_shape).
std::vector<ShapeDecision> bf16_shape_decisions();

/// Number of CPU products the route has computed in this process, few-row products
/// (precision/few_rows_bf16.h) included (tests check it is used).
std::uint64_t bf16_routed_calls();

/// The route installed for this object's lifetime (nested installs are counted; the kernels stay
/// until the last one goes). Tests use it to compare the route with the native kernels; a
/// program uses configure_bf16_products().
class Bf16Route {
 public:
  /// Every bf16 product through fp32, or, given `per_shape` (which must outlive the route), as
  /// it decides per shape class. One per-shape policy at a time; the innermost install's wins.
  explicit Bf16Route(ShapeRouting* per_shape = nullptr);
  ~Bf16Route();
  Bf16Route(const Bf16Route&) = delete;
  Bf16Route& operator=(const Bf16Route&) = delete;

 private:
  ShapeRouting* previous_ = nullptr;  // the policy in force before this install
};

/// Whether the route is installed now.
bool bf16_route_installed();

/// The operators the route serves ("aten::mm", "aten::mm.out", ...), as registered.
const char* const* bf16_routed_operators();

}  // namespace refit::precision
