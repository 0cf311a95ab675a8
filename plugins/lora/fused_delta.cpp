#include "fused_delta.h"

#include "cpu_small_mm.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace refit::lora {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearDelta : public torch::autograd::Function<LinearDelta> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& A,
                               const torch::Tensor& B, double scaling, c10::ScalarType compute) {
    // The products run below autocast (their operands already have the compute dtype).
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto x2 = x.reshape({-1, x.size(-1)}).to(compute);
    const auto a = A.to(compute), b = B.to(compute);
    const auto xa = mm_bf16_cpu_or_aten(x2, a.t());
    auto out = mm_bf16_cpu_or_aten(xa, b.t());
    if (scaling != 1.0) out = out.mul(scaling);  // a separate rounding step, as `delta * scaling`
    ctx->save_for_backward({x2, a, b, xa});
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["A_dtype"] = static_cast<int64_t>(A.scalar_type());
    ctx->saved_data["B_dtype"] = static_cast<int64_t>(B.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = b.size(0);
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
    auto g = grads[0].reshape({-1, b.size(0)});
    if (g.scalar_type() != b.scalar_type()) g = g.to(b.scalar_type());
    if (scaling != 1.0) g = g.mul(scaling);
    const auto g_xa = mm_bf16_cpu_or_aten(g, b);
    torch::Tensor dx, dA, dB;
    if (ctx->needs_input_grad(0)) {
      dx = mm_bf16_cpu_or_aten(g_xa, a).to(static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
      dx = dx.view(ctx->saved_data["x_shape"].toIntVector());
    }
    // Back to the factors' own dtype (fp32), as autocast's ToCopyBackward does.
    if (ctx->needs_input_grad(1)) dA = mm_bf16_cpu_or_aten(g_xa.t(), x2).to(static_cast<c10::ScalarType>(ctx->saved_data["A_dtype"].toInt()));
    if (ctx->needs_input_grad(2)) dB = mm_bf16_cpu_or_aten(g.t(), xa).to(static_cast<c10::ScalarType>(ctx->saved_data["B_dtype"].toInt()));
    return {dx, dA, dB, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_linear_delta(const torch::Tensor& x, const torch::Tensor& lora_A, const torch::Tensor& lora_B,
                                 double scaling) {
  const auto device = x.device().type();
  const auto compute = at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device)
                                                                  : lora_A.scalar_type();
  return LinearDelta::apply(x, lora_A, lora_B, scaling, compute);
}

}  // namespace refit::lora
