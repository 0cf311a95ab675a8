#pragma once
// bf16 products on CPUs without fast bf16 kernels.
//
// A frozen bf16 backbone spends its step in matrix products and convolutions. Where the CPU has
// no native bf16 arithmetic (AVX2-only x86: no AVX512-BF16, no AMX), LibTorch's bf16 products
// fall back to scalar loops: ~100x slower than the same product in fp32 on the same CPU. A bf16
// kernel's arithmetic is: widen the bf16 operands to fp32 (exact), multiply-accumulate in fp32,
// round the result once to bf16. The fp32 kernels do the same arithmetic once the operands are
// widened, so on such CPUs refit routes every CPU bf16 product through them:
//
//   result = round_to_bf16( fp32_kernel( widen(a), widen(b) ) )
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

namespace refit::precision {

/// How this process computes bf16 products on the CPU, decided once.
struct Bf16Products {
  bool native = true;           // LibTorch's bf16 kernels are used as they are
  bool routed = false;          // the fp32 route is installed (native == !routed)
  std::string decided_by;       // "probe" or "REFIT_BF16_PRODUCTS=<value>"
  double bf16_over_fp32 = 0.0;  // measured time ratio of a 128^3 bf16 / fp32 matmul (0: not probed)
  std::string cpu_capability;   // ATen's vector ISA in use ("AVX512", "AVX2", ...)
  std::string route_error;      // why the route could not be installed (then native), or ""
  /// One line for the run header, `refit --version` and the report:
  /// "native bf16 kernels (bf16/fp32 matmul time 0.4x, probe; ATen AVX512)" or
  /// "fp32 kernels, results rounded to bf16 (no fast bf16 here: bf16/fp32 matmul time 38x, probe; ATen AVX2)".
  std::string describe() const;
};

/// Decides (once per process) whether CPU bf16 products go through fp32 kernels, and installs
/// the route if so; later calls return the same decision. The environment variable
/// REFIT_BF16_PRODUCTS chooses: "auto" (default: a probe times a 128x128x128 matmul in bf16 and
/// in fp32 and routes when bf16 is over 4x slower), "native" or "fp32". Any other value throws.
/// Call it before the first forward (the CLI and the test and benchmark programs do it first).
const Bf16Products& configure_bf16_products();

/// Number of CPU products the route has computed in this process (tests check it is used).
std::uint64_t bf16_routed_calls();

/// The route installed for this object's lifetime (nested installs are counted; the kernels stay
/// until the last one goes). Tests use it to compare the route with the native kernels; a
/// program uses configure_bf16_products().
class Bf16Route {
 public:
  Bf16Route();
  ~Bf16Route();
  Bf16Route(const Bf16Route&) = delete;
  Bf16Route& operator=(const Bf16Route&) = delete;
};

/// Whether the route is installed now.
bool bf16_route_installed();

/// The operators the route serves ("aten::mm", "aten::mm.out", ...), as registered.
const char* const* bf16_routed_operators();

}  // namespace refit::precision
