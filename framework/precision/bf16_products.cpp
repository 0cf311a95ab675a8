#include "precision/bf16_products.h"

#include "precision/few_rows_bf16.h"
#include "precision/shape_routing.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_cpu_dispatch.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_cpu_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/baddbmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/convolution_backward_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/convolution_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <torch/library.h>
#include <torch/types.h>

namespace refit::precision {
namespace {

using at::Scalar;
using at::Tensor;

std::atomic<std::uint64_t> routed_calls{0};

bool bf16(const Tensor& t) { return t.scalar_type() == at::kBFloat16; }
bool bf16_or_absent(const std::optional<Tensor>& t) { return !t || !t->defined() || bf16(*t); }
// A bf16 operand widened to fp32: exact (fp32 has bf16's exponent and more mantissa).
Tensor widen(const Tensor& t) { return t.defined() && bf16(t) ? t.to(at::kFloat) : t; }
std::optional<Tensor> widen(const std::optional<Tensor>& t) {
  return t && t->defined() ? std::optional<Tensor>(widen(*t)) : t;
}
// The fp32 result rounded once to bf16 (round to nearest even, as a bf16 kernel's output).
Tensor narrow(const Tensor& t) { return t.defined() ? t.to(at::kBFloat16) : t; }
Tensor& into(Tensor& out, const Tensor& result) {
  if (out.sizes() != result.sizes()) out.resize_(result.sizes());
  return out.copy_(result);
}
void count() { routed_calls.fetch_add(1, std::memory_order_relaxed); }

// The per-shape policy while one is installed (Bf16Route(ShapeRouting*), the "measure" mode),
// else null: every bf16 call goes through fp32.
std::atomic<ShapeRouting*> per_shape{nullptr};

// The operands' shape class (precision/shape_routing.h): sizes and layouts.
std::string class_of(const char* op, std::initializer_list<const Tensor*> operands) {
  std::vector<std::vector<std::int64_t>> sizes;
  std::string layouts;
  for (const Tensor* t : operands) {
    if (!t || !t->defined()) continue;
    sizes.push_back(t->sizes().vec());
    char layout = 'c';
    if (!t->is_contiguous()) {
      const auto d = t->dim();
      const bool transposed =
          d >= 2 && t->stride(d - 2) == 1 && t->stride(d - 1) == std::max<std::int64_t>(t->size(d - 2), 1);
      layout = transposed ? 't' : 's';
    }
    layouts += layout;
  }
  return shape_class(op, sizes, layouts);
}

// Whether this all-bf16 call goes through fp32. `native` and `fp32` compute the product without
// touching any operand (the functional forms), for the per-shape policy to time on the first
// call of a shape class. None of them draws random numbers (LibTorch's CPU flash attention
// refuses dropout), so timing one leaves every generator where it was.
template <class Native, class Fp32>
bool use_fp32(const char* op, std::initializer_list<const Tensor*> operands, const Native& native, const Fp32& fp32) {
  ShapeRouting* routing = per_shape.load(std::memory_order_acquire);
  const bool route = !routing || routing->route_fp32(
                                     class_of(op, operands), [&] { (void)native(); }, [&] { (void)fp32(); });
  if (route) count();
  return route;
}

// Few rows against a row-major weight (decoding): precision/few_rows_bf16.h, before either side.
// Counted as routed: the route's registration computes them. The loop it runs, or `none` when the
// call does not fit. Where VDPBF16PS runs, the per-shape policy times its loop against the
// AVX-512 FMA loop (bf16 widened to fp32: the policy's "fp32" side) on the first call per weight
// shape, whatever the rows: on some CPUs the FMA units have twice VDPBF16PS's throughput
// (docs/performance.md, "Decoding"), on others half; one loop per weight shape keeps a sequence's
// results the same alone as in a batch.
FewRowsIsa few_rows(const Tensor& a, const Tensor& b, const Tensor& bias = {}) {
  const FewRowsIsa isa = few_rows_isa();
  if (!few_rows_bf16_fits(a, b, bias, isa)) return FewRowsIsa::none;
  count();
  ShapeRouting* routing = per_shape.load(std::memory_order_acquire);
  if (isa != FewRowsIsa::avx512_bf16 || !routing || !few_rows_bf16_fits(a, b, bias, FewRowsIsa::avx512)) return isa;
  const bool fma = routing->route_fp32(
      shape_class("few-rows", {{b.size(0), b.size(1)}}), [&] { (void)few_rows_bf16_mm(a, b, bias, isa); },
      [&] { (void)few_rows_bf16_mm(a, b, bias, FewRowsIsa::avx512); });
  return fma ? FewRowsIsa::avx512 : isa;
}
bool unit(const Scalar& s) { return !s.isComplex() && s.toDouble() == 1.0; }

// Each kernel: operands all bf16 -> the fp32 kernel on widened operands, rounded (unless the
// per-shape policy chose the native kernel for this shape); otherwise LibTorch's own CPU kernel
// for the operator (the one this registration shadows).

Tensor mm(const Tensor& a, const Tensor& b) {
  if (const auto loop = few_rows(a, b); loop != FewRowsIsa::none) return few_rows_bf16_mm(a, b, {}, loop);
  const auto native = [&] { return at::cpu::mm(a, b); };
  const auto fp32 = [&] { return narrow(at::cpu::mm(widen(a), widen(b))); };
  return bf16(a) && bf16(b) && use_fp32("mm", {&a, &b}, native, fp32) ? fp32() : native();
}
Tensor& mm_out(const Tensor& a, const Tensor& b, Tensor& out) {
  if (const auto loop = bf16(out) ? few_rows(a, b) : FewRowsIsa::none; loop != FewRowsIsa::none)
    return into(out, few_rows_bf16_mm(a, b, {}, loop));
  const auto native = [&] { return at::cpu::mm(a, b); };
  const auto fp32 = [&] { return narrow(at::cpu::mm(widen(a), widen(b))); };
  if (bf16(a) && bf16(b) && bf16(out) && use_fp32("mm", {&a, &b}, native, fp32))
    return into(out, at::cpu::mm(widen(a), widen(b)));
  return at::cpu::mm_outf(a, b, out);
}
Tensor bmm(const Tensor& a, const Tensor& b) {
  const auto native = [&] { return at::cpu::bmm(a, b); };
  const auto fp32 = [&] { return narrow(at::cpu::bmm(widen(a), widen(b))); };
  return bf16(a) && bf16(b) && use_fp32("bmm", {&a, &b}, native, fp32) ? fp32() : native();
}
Tensor& bmm_out(const Tensor& a, const Tensor& b, Tensor& out) {
  const auto native = [&] { return at::cpu::bmm(a, b); };
  const auto fp32 = [&] { return narrow(at::cpu::bmm(widen(a), widen(b))); };
  if (bf16(a) && bf16(b) && bf16(out) && use_fp32("bmm", {&a, &b}, native, fp32))
    return into(out, at::cpu::bmm(widen(a), widen(b)));
  return at::cpu::bmm_outf(a, b, out);
}
// beta * self + alpha * (m1 @ m2), all in fp32, rounded once (as the bf16 GEMM's epilogue).
Tensor addmm(const Tensor& self, const Tensor& m1, const Tensor& m2, const Scalar& beta, const Scalar& alpha) {
  if (const auto loop = unit(beta) && unit(alpha) ? few_rows(m1, m2, self) : FewRowsIsa::none; loop != FewRowsIsa::none)
    return few_rows_bf16_mm(m1, m2, self, loop);
  const auto native = [&] { return at::cpu::addmm(self, m1, m2, beta, alpha); };
  const auto fp32 = [&] { return narrow(at::cpu::addmm(widen(self), widen(m1), widen(m2), beta, alpha)); };
  return bf16(self) && bf16(m1) && bf16(m2) && use_fp32("addmm", {&m1, &m2}, native, fp32) ? fp32() : native();
}
Tensor& addmm_out(const Tensor& self, const Tensor& m1, const Tensor& m2, const Scalar& beta, const Scalar& alpha,
                  Tensor& out) {
  if (const auto loop = bf16(out) && unit(beta) && unit(alpha) ? few_rows(m1, m2, self) : FewRowsIsa::none;
      loop != FewRowsIsa::none)
    return into(out, few_rows_bf16_mm(m1, m2, self, loop));
  const auto native = [&] { return at::cpu::addmm(self, m1, m2, beta, alpha); };
  const auto fp32 = [&] { return narrow(at::cpu::addmm(widen(self), widen(m1), widen(m2), beta, alpha)); };
  if (bf16(self) && bf16(m1) && bf16(m2) && bf16(out) && use_fp32("addmm", {&m1, &m2}, native, fp32))
    return into(out, at::cpu::addmm(widen(self), widen(m1), widen(m2), beta, alpha));
  return at::cpu::addmm_outf(self, m1, m2, beta, alpha, out);
}
Tensor& addmm_inplace(Tensor& self, const Tensor& m1, const Tensor& m2, const Scalar& beta, const Scalar& alpha) {
  const auto native = [&] { return at::cpu::addmm(self, m1, m2, beta, alpha); };
  const auto fp32 = [&] { return narrow(at::cpu::addmm(widen(self), widen(m1), widen(m2), beta, alpha)); };
  if (bf16(self) && bf16(m1) && bf16(m2) && use_fp32("addmm", {&m1, &m2}, native, fp32))
    return self.copy_(at::cpu::addmm(widen(self), widen(m1), widen(m2), beta, alpha));
  return at::cpu::addmm_(self, m1, m2, beta, alpha);
}
Tensor baddbmm(const Tensor& self, const Tensor& b1, const Tensor& b2, const Scalar& beta, const Scalar& alpha) {
  const auto native = [&] { return at::cpu::baddbmm(self, b1, b2, beta, alpha); };
  const auto fp32 = [&] { return narrow(at::cpu::baddbmm(widen(self), widen(b1), widen(b2), beta, alpha)); };
  return bf16(self) && bf16(b1) && bf16(b2) && use_fp32("baddbmm", {&b1, &b2}, native, fp32) ? fp32() : native();
}
Tensor& baddbmm_out(const Tensor& self, const Tensor& b1, const Tensor& b2, const Scalar& beta, const Scalar& alpha,
                    Tensor& out) {
  const auto native = [&] { return at::cpu::baddbmm(self, b1, b2, beta, alpha); };
  const auto fp32 = [&] { return narrow(at::cpu::baddbmm(widen(self), widen(b1), widen(b2), beta, alpha)); };
  if (bf16(self) && bf16(b1) && bf16(b2) && bf16(out) && use_fp32("baddbmm", {&b1, &b2}, native, fp32))
    return into(out, at::cpu::baddbmm(widen(self), widen(b1), widen(b2), beta, alpha));
  return at::cpu::baddbmm_outf(self, b1, b2, beta, alpha, out);
}
Tensor& baddbmm_inplace(Tensor& self, const Tensor& b1, const Tensor& b2, const Scalar& beta, const Scalar& alpha) {
  const auto native = [&] { return at::cpu::baddbmm(self, b1, b2, beta, alpha); };
  const auto fp32 = [&] { return narrow(at::cpu::baddbmm(widen(self), widen(b1), widen(b2), beta, alpha)); };
  if (bf16(self) && bf16(b1) && bf16(b2) && use_fp32("baddbmm", {&b1, &b2}, native, fp32))
    return self.copy_(at::cpu::baddbmm(widen(self), widen(b1), widen(b2), beta, alpha));
  return at::cpu::baddbmm_(self, b1, b2, beta, alpha);
}

// aten::convolution and aten::convolution_backward have no CPU kernel of their own (the
// CompositeExplicitAutograd one serves every backend); this CPU kernel takes precedence on CPU.
Tensor convolution(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias, c10::SymIntArrayRef stride,
                   c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed,
                   c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  const auto native = [&] {
    return at::compositeexplicitautograd::convolution_symint(input, weight, bias, stride, padding, dilation, transposed,
                                                             output_padding, groups);
  };
  const auto fp32 = [&] {
    return narrow(at::compositeexplicitautograd::convolution_symint(widen(input), widen(weight), widen(bias), stride,
                                                                    padding, dilation, transposed, output_padding, groups));
  };
  return bf16(input) && bf16(weight) && bf16_or_absent(bias) && use_fp32("convolution", {&input, &weight}, native, fp32)
             ? fp32()
             : native();
}
std::tuple<Tensor, Tensor, Tensor> convolution_backward(const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                                                        at::OptionalSymIntArrayRef bias_sizes, c10::SymIntArrayRef stride,
                                                        c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
                                                        bool transposed, c10::SymIntArrayRef output_padding,
                                                        c10::SymInt groups, std::array<bool, 3> output_mask) {
  const auto native = [&] {
    return at::compositeexplicitautograd::convolution_backward_symint(grad_output, input, weight, bias_sizes, stride,
                                                                      padding, dilation, transposed, output_padding, groups,
                                                                      output_mask);
  };
  const auto fp32 = [&] {
    auto [gi, gw, gb] =
        at::compositeexplicitautograd::convolution_backward_symint(widen(grad_output), widen(input), widen(weight),
                                                                   bias_sizes, stride, padding, dilation, transposed,
                                                                   output_padding, groups, output_mask);
    return std::tuple<Tensor, Tensor, Tensor>{narrow(gi), narrow(gw), narrow(gb)};
  };
  return bf16(grad_output) && bf16(input) && bf16(weight) &&
                 use_fp32("convolution_backward", {&grad_output, &input, &weight}, native, fp32)
             ? fp32()
             : native();
}

// The CPU flash attention (what scaled_dot_product_attention runs on CPU). The log-sum-exp it
// returns is fp32 in both kernels; the output and the gradients are rounded to bf16.
std::tuple<Tensor, Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                                           bool is_causal, const std::optional<Tensor>& attn_mask,
                                           std::optional<double> scale) {
  const auto native = [&] {
    return at::cpu::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, attn_mask, scale);
  };
  const auto fp32 = [&] {
    auto [out, lse] = at::cpu::_scaled_dot_product_flash_attention_for_cpu(widen(q), widen(k), widen(v), dropout_p,
                                                                           is_causal, widen(attn_mask), scale);
    return std::tuple<Tensor, Tensor>{narrow(out), lse};
  };
  return bf16(q) && bf16(k) && bf16(v) && use_fp32("flash_attention", {&q, &k, &v}, native, fp32) ? fp32() : native();
}
std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                            const Tensor& v, const Tensor& out, const Tensor& lse,
                                                            double dropout_p, bool is_causal,
                                                            const std::optional<Tensor>& attn_mask,
                                                            std::optional<double> scale) {
  const auto native = [&] {
    return at::cpu::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, dropout_p, is_causal,
                                                                         attn_mask, scale);
  };
  const auto fp32 = [&] {
    auto [gq, gk, gv] = at::cpu::_scaled_dot_product_flash_attention_for_cpu_backward(widen(grad_out), widen(q), widen(k),
                                                                                      widen(v), widen(out), lse, dropout_p,
                                                                                      is_causal, widen(attn_mask), scale);
    return std::tuple<Tensor, Tensor, Tensor>{narrow(gq), narrow(gk), narrow(gv)};
  };
  return bf16(grad_out) && bf16(q) && bf16(k) && bf16(v) && bf16(out) &&
                 use_fp32("flash_attention_backward", {&q, &k, &v}, native, fp32)
             ? fp32()
             : native();
}

constexpr const char* kOperators[] = {
    "aten::mm",
    "aten::mm.out",
    "aten::bmm",
    "aten::bmm.out",
    "aten::addmm",
    "aten::addmm.out",
    "aten::addmm_",
    "aten::baddbmm",
    "aten::baddbmm.out",
    "aten::baddbmm_",
    "aten::convolution",
    "aten::convolution_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    nullptr,
};

// Registering a CPU kernel where LibTorch has one prints c10's "Overriding a previously
// registered kernel" warning (once per process); that shadowing is the intent here.
class QuietOverrides : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override {
    if (w.msg().find("Overriding a previously registered kernel") == std::string::npos) fallback_.process(w);
  }

 private:
  c10::WarningHandler fallback_;
};

std::unique_ptr<torch::Library> register_route() {
  QuietOverrides quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
  lib->impl("mm", TORCH_FN(mm));
  lib->impl("mm.out", TORCH_FN(mm_out));
  lib->impl("bmm", TORCH_FN(bmm));
  lib->impl("bmm.out", TORCH_FN(bmm_out));
  lib->impl("addmm", TORCH_FN(addmm));
  lib->impl("addmm.out", TORCH_FN(addmm_out));
  lib->impl("addmm_", TORCH_FN(addmm_inplace));
  lib->impl("baddbmm", TORCH_FN(baddbmm));
  lib->impl("baddbmm.out", TORCH_FN(baddbmm_out));
  lib->impl("baddbmm_", TORCH_FN(baddbmm_inplace));
  lib->impl("convolution", TORCH_FN(convolution));
  lib->impl("convolution_backward", TORCH_FN(convolution_backward));
  lib->impl("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(flash_attention));
  lib->impl("_scaled_dot_product_flash_attention_for_cpu_backward", TORCH_FN(flash_attention_backward));
  return lib;
}

std::mutex route_mutex;
int route_users = 0;
std::unique_ptr<torch::Library> route;

// CPU seconds of the calling thread: unlike wall time, a loaded machine's preemption does not
// count (the probe runs on one thread, so the thread's CPU time is the product's).
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Thread CPU seconds of the fastest of `reps` calls of a*b (after one warm-up call: oneDNN
// builds its primitive on the first), through LibTorch's CPU kernel itself: not the dispatcher,
// where the route (installed by then) would time itself and record the probe's shape.
double best_seconds(const Tensor& a, const Tensor& b, int reps) {
  (void)at::cpu::mm(a, b);
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = thread_seconds();
    (void)at::cpu::mm(a, b);
    best = std::min(best, thread_seconds() - t0);
  }
  return best;
}

// Time ratio of a bf16 and an fp32 128x128x128 matmul through LibTorch's own kernels, on one
// thread. Deterministic operands (the global RNG stays untouched: runs are seeded).
double probe_bf16_over_fp32() {
  at::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // the dtypes as given
  // One thread for the probe, the caller's count restored however it ends.
  struct OneThread {
    const int threads = at::get_num_threads();
    OneThread() { at::set_num_threads(1); }
    ~OneThread() { at::set_num_threads(threads); }
  } one_thread;
  const auto a = at::arange(128 * 128, at::kFloat).reshape({128, 128}).mul(0.37).sin();
  const auto b = a.t().contiguous().cos();
  const double fp32 = best_seconds(a, b, 5);
  const double bf = best_seconds(a.to(at::kBFloat16), b.to(at::kBFloat16), 5);
  return bf / std::max(fp32, 1e-9);
}

Bf16Products decide() {
  Bf16Products p;
  p.cpu_capability = at::get_cpu_capability();
  const char* env = std::getenv("REFIT_BF16_PRODUCTS");
  const std::string choice = env && *env ? env : "auto";
  if (choice == "native" || choice == "fp32") {
    p.native = choice == "native";
    p.decided_by = "REFIT_BF16_PRODUCTS=" + choice;
  } else if (choice == "auto") {
    // No single answer per process is right: oneDNN's native bf16 kernels have a fixed cost per
    // call that loses to the fp32 route on small products and wins on large ones (AMX,
    // AVX512-BF16), and even LibTorch's scalar fallback (AVX2) beats the route where widening a
    // large operand costs more than the product. So every shape class is timed. The probe's
    // ratio stays in the description: it says what kind of bf16 this CPU has.
    p.native = false;
    p.per_shape = true;
    p.decided_by = "auto";
  } else {
    throw std::runtime_error("REFIT_BF16_PRODUCTS=" + choice + ": expected auto, native or fp32");
  }
  p.routed = !p.native && !p.per_shape;
  return p;
}

}  // namespace

std::string Bf16Products::describe() const {
  char ratio[64] = "";
  // The ratio of a 128^3 bf16 and fp32 matmul (LibTorch's kernels, one thread), where the decision
  // is the machine's: timed here, once per process, not at start-up (each process would pay ~30 ms
  // for a line few print; `refit train` prints it first, before any other thread runs).
  if (decided_by == "auto") {
    static const double bf16_over_fp32 = probe_bf16_over_fp32();
    std::snprintf(ratio, sizeof ratio, "bf16/fp32 matmul time %.1fx, ", bf16_over_fp32);
  }
  const std::string why = std::string("(") + ratio + decided_by + "; ATen " + cpu_capability + ")";
  if (!route_error.empty()) return "native bf16 kernels " + why + "; the fp32 route failed to install: " + route_error;
  if (per_shape)
    return "per product shape, the faster of the native bf16 kernel and the fp32 route, timed on first use " + why +
           (shape_store.empty() ? "" : "; decisions kept in " + shape_store);
  return native ? "native bf16 kernels " + why : "fp32 kernels, results rounded to bf16 " + why;
}

namespace {

// The machine's decision store: one file per CPU model, thread count, ATen ISA, oneDNN ISA limit
// and LibTorch version (what changes the kernels' speed), in the folder REFIT_BF16_PRODUCTS_CACHE
// names ("off": none; default $XDG_CACHE_HOME/refit, else ~/.cache/refit). A folder, not a file:
// one setting serves a native run and an emulated one without mixing their decisions.
std::string shape_store_path(const Bf16Products& p) {
  std::string root;
  if (const char* v = std::getenv("REFIT_BF16_PRODUCTS_CACHE"); v && *v) {
    if (std::string(v) == "off") return "";
    root = v;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    root = std::string(x) + "/refit";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    root = std::string(h) + "/.cache/refit";
  } else {
    return "";
  }
  std::string model;
  {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("model name", 0) == 0) {
        model = line.substr(line.find(':') + 1);
        break;
      }
  }
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::string key = model + "|" + std::to_string(at::get_num_threads()) + "|" + p.cpu_capability + "|" +
                          (isa ? isa : "") + "|" + TORCH_VERSION;
  char name[64];
  std::snprintf(name, sizeof name, "bf16-products-%016zx.json", std::hash<std::string>{}(key));
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return "";
  return root + "/" + name;
}

// The process's policy; configure_bf16_products() makes the first call, with its decision.
ShapeRouting& process_shape_routing(const Bf16Products* decided = nullptr) {
  static ShapeRouting routing = [decided] {
    ShapeRoutingOptions o;
    if (decided) o.store = shape_store_path(*decided);
    return ShapeRouting(o);
  }();
  return routing;
}

}  // namespace

const Bf16Products& configure_bf16_products() {
  static const Bf16Products decided = [] {
    Bf16Products p = decide();
    if (!p.native) {
      try {
        static Bf16Route process_route(p.per_shape ? &process_shape_routing(&p) : nullptr);  // for the life of the process
        if (p.per_shape) p.shape_store = process_shape_routing().store();
      } catch (const std::exception& e) {
        // A LibTorch whose operators moved: LibTorch's own kernels (slow here, but correct).
        p.routed = false;
        p.per_shape = false;
        p.native = true;
        p.route_error = c10::str(e.what()).substr(0, 200);
      }
    }
    return p;
  }();
  return decided;
}

std::vector<ShapeDecision> bf16_shape_decisions() {
  return configure_bf16_products().per_shape ? process_shape_routing().decisions() : std::vector<ShapeDecision>{};
}

std::uint64_t bf16_routed_calls() { return routed_calls.load(std::memory_order_relaxed); }

Bf16Route::Bf16Route(ShapeRouting* policy) {
  std::lock_guard<std::mutex> lock(route_mutex);
  if (route_users == 0) route = register_route();
  ++route_users;
  previous_ = per_shape.exchange(policy, std::memory_order_acq_rel);
}
Bf16Route::~Bf16Route() {
  std::lock_guard<std::mutex> lock(route_mutex);
  per_shape.store(previous_, std::memory_order_release);
  if (--route_users == 0) route.reset();  // LibTorch's own kernels are the CPU kernels again
}

bool bf16_route_installed() {
  std::lock_guard<std::mutex> lock(route_mutex);
  return route != nullptr;
}

const char* const* bf16_routed_operators() { return kOperators; }

}  // namespace refit::precision
