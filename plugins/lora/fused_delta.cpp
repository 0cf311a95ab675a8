#include "fused_delta.h"

#include "cpu_small_mm.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace refit::lora {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The CPU microkernel path (cpu_small_mm.h): bf16 compute on a CPU that has it, operands it
// can round while packing, and every product of the layer small enough (all six have
// rows x rank x in or rows x rank x out multiply-adds).
bool use_cpu_microkernel(const torch::Tensor& x, const torch::Tensor& A, const torch::Tensor& B, c10::ScalarType compute) {
  auto f32_or_bf16 = [](const torch::Tensor& t) {
    return t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16;
  };
  if (!x.is_cpu() || compute != torch::kBFloat16 || !f32_or_bf16(x) || !f32_or_bf16(A) || !f32_or_bf16(B)) return false;
  // oneDNN switched off at run time (torch.backends.mkldnn) switches ATen's bf16 microkernel off too.
  if (!at::globalContext().userEnabledMkldnn()) return false;
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(x.size(-1), 1);
  return small_mm_bf16_fits(rows, std::max(A.size(1), B.size(0)), A.size(0)) && small_mm_bf16_available() &&
         small_mm_bf16_admit(rows);
}

struct LinearDelta : public torch::autograd::Function<LinearDelta> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& A, const torch::Tensor& B,
                               double scaling, c10::ScalarType compute) {
    // The products run below autocast (their operands already have the compute dtype).
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["A_dtype"] = static_cast<int64_t>(A.scalar_type());
    ctx->saved_data["B_dtype"] = static_cast<int64_t>(B.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = B.size(0);
    const bool micro = use_cpu_microkernel(x, A, B, compute);
    ctx->saved_data["micro"] = micro;
    if (micro) {
      // The casts to bf16 happen inside the packing (same bits as .to(kBFloat16)); fp32 A and B
      // are saved as they are (they are the parameters: no copy).
      // (No .t() or no-op reshape/view dispatches: transposes are flags, a 2-D x is used as is.)
      const bool flat = x.dim() == 2;
      const auto x2 = flat ? x : x.reshape({-1, x.size(-1)});
      const auto xa = small_mm_bf16(x2, A, torch::kBFloat16, false, /*transpose_b=*/true);
      auto out = small_mm_bf16(xa, B, torch::kBFloat16, false, /*transpose_b=*/true);
      if (scaling != 1.0) out = out.mul(scaling);
      ctx->save_for_backward({x2, A, B, xa});
      return flat ? out : out.view(shape);
    }
    const auto x2 = x.reshape({-1, x.size(-1)}).to(compute);
    const auto a = A.to(compute), b = B.to(compute);
    const auto xa = at::mm(x2, a.t());
    auto out = at::mm(xa, b.t());
    if (scaling != 1.0) out = out.mul(scaling);  // a separate rounding step, as `delta * scaling`
    ctx->save_for_backward({x2, a, b, xa});
    return out.view(shape);
  }

  // The formulas are autograd's for linear = mm(input, weight.t()): d input = grad.mm(weight),
  // d weight = grad.t().mm(input) (FunctionsManual's mm_mat2_backward for a transposed mat2).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // Grad mode is on here only under create_graph: the products below would not be recorded
    // through the saved casts, and higher-order gradients would come out silently wrong.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "lora: the fused LoRA delta is differentiable once; for higher-order gradients (create_graph) set "
                "\"fused\": false in the lora adapter's config");
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto &x2 = saved[0], &a = saved[1], &b = saved[2], &xa = saved[3];
    const double scaling = ctx->saved_data["scaling"].toDouble();
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto A_dtype = static_cast<c10::ScalarType>(ctx->saved_data["A_dtype"].toInt());
    const auto B_dtype = static_cast<c10::ScalarType>(ctx->saved_data["B_dtype"].toInt());
    const auto compute = xa.scalar_type();
    const auto x_shape = ctx->saved_data["x_shape"].toIntVector();
    const bool flat = x_shape.size() == 2;  // the forward used x and returned its output as they were
    auto g = flat ? grads[0] : grads[0].reshape({-1, b.size(0)});
    if (g.scalar_type() != compute) g = g.to(compute);
    if (scaling != 1.0) g = g.mul(scaling);
    torch::Tensor dx, dA, dB;
    if (ctx->saved_data["micro"].toBool()) {  // a, b: the fp32 (or bf16) factors, rounded as packed
      const auto g_xa = small_mm_bf16(g, b);
      if (ctx->needs_input_grad(0)) {
        dx = small_mm_bf16(g_xa, a, x_dtype);
        if (!flat) dx = dx.view(x_shape);
      }
      if (ctx->needs_input_grad(1)) dA = small_mm_bf16(g_xa, x2, A_dtype, /*transpose_a=*/true);
      if (ctx->needs_input_grad(2)) dB = small_mm_bf16(g, xa, B_dtype, /*transpose_a=*/true);
      return {dx, dA, dB, torch::Tensor(), torch::Tensor()};
    }
    const auto g_xa = g.mm(b);
    if (ctx->needs_input_grad(0)) dx = g_xa.mm(a).to(x_dtype).view(x_shape);
    // Back to the factors' own dtype (fp32), as autocast's ToCopyBackward does.
    if (ctx->needs_input_grad(1)) dA = g_xa.t().mm(x2).to(A_dtype);
    if (ctx->needs_input_grad(2)) dB = g.t().mm(xa).to(B_dtype);
    return {dx, dA, dB, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_linear_delta(const torch::Tensor& x, const torch::Tensor& lora_A, const torch::Tensor& lora_B,
                                 double scaling) {
  const auto device = x.device().type();
  const auto compute =
      at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : lora_A.scalar_type();
  return LinearDelta::apply(x, lora_A, lora_B, scaling, compute);
}

}  // namespace refit::lora
