#include "objectives/chunked_cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "refit/autocast.h"
#include "refit/error.h"

namespace refit {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk's fp32 logits, as the unchunked `(hidden @ weight^T).float()` computes them.
torch::Tensor chunk_logits(const torch::Tensor& h, const torch::Tensor& w_compute, c10::ScalarType cd) {
  return at::matmul(h.to(cd), w_compute.t()).to(torch::kFloat);
}

class ChunkedLinearCrossEntropy : public torch::autograd::Function<ChunkedLinearCrossEntropy> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, std::int64_t chunk, std::int64_t compute_dtype,
                               std::int64_t ignore_index) {
    const auto cd = static_cast<c10::ScalarType>(compute_dtype);
    // The products run in the dtype given, never re-cast by an enclosing autocast.
    AutocastOff off(hidden.device().type());
    const torch::Tensor w = weight.to(cd);  // once for every chunk (no copy when already cd)
    auto opts = hidden.options().dtype(torch::kFloat);
    torch::Tensor loss = torch::zeros({}, opts), correct = torch::zeros({}, opts);
    const std::int64_t n = hidden.size(0);
    for (std::int64_t start = 0; start < n; start += chunk) {
      const std::int64_t rows = std::min(chunk, n - start);
      const torch::Tensor t = targets.narrow(0, start, rows);
      const torch::Tensor logits = chunk_logits(hidden.narrow(0, start, rows), w, cd);
      const torch::Tensor valid = t.ne(ignore_index);
      const torch::Tensor picked = logits.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);
      // where(), not a product with the mask: a row of -inf logits at an ignored position must
      // count nothing, not NaN.
      const torch::Tensor nll = at::where(valid, at::logsumexp(logits, {1}) - picked, at::zeros_like(picked));
      loss.add_(nll.sum());
      correct.add_(logits.argmax(1).eq(t).logical_and(valid).sum().to(torch::kFloat));
    }
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["cd"] = compute_dtype;
    ctx->saved_data["ignore"] = ignore_index;
    ctx->mark_non_differentiable({correct});
    return {loss, correct};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2];
    const std::int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto cd = static_cast<c10::ScalarType>(ctx->saved_data["cd"].toInt());
    const std::int64_t ignore_index = ctx->saved_data["ignore"].toInt();
    const torch::Tensor g = grad_outputs[0].to(torch::kFloat);
    AutocastOff off(hidden.device().type());
    const torch::Tensor w = weight.to(cd);
    const bool weight_grad = ctx->needs_input_grad(1);
    torch::Tensor grad_hidden = at::empty_like(hidden);
    torch::Tensor grad_weight =
        weight_grad ? at::zeros(weight.sizes(), weight.options().dtype(torch::kFloat)) : torch::Tensor();
    const std::int64_t n = hidden.size(0);
    for (std::int64_t start = 0; start < n; start += chunk) {
      const std::int64_t rows = std::min(chunk, n - start);
      const torch::Tensor t = targets.narrow(0, start, rows);
      const torch::Tensor h = hidden.narrow(0, start, rows);
      // d(logsumexp - picked)/dlogits = softmax - onehot, for the rows with a target.
      torch::Tensor p = at::softmax(chunk_logits(h, w, cd), 1);
      const torch::Tensor valid = t.ne(ignore_index).to(torch::kFloat).unsqueeze(1);
      p.scatter_add_(1, t.clamp_min(0).unsqueeze(1), -valid);
      p.mul_(valid * g);
      // The fp32 logits' gradient reaches the product in its dtype, as autograd through
      // `.to(kFloat)` would hand it on.
      const torch::Tensor gl = p.to(cd);
      grad_hidden.narrow(0, start, rows).copy_(at::matmul(gl, w));
      if (weight_grad) grad_weight.add_(at::matmul(gl.t(), h.to(cd)).to(torch::kFloat));
    }
    return {grad_hidden,     weight_grad ? grad_weight.to(weight.scalar_type()) : torch::Tensor(),
            torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

ChunkedCrossEntropyResult chunked_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                       const torch::Tensor& targets, std::int64_t chunk_rows,
                                                       c10::ScalarType compute_dtype, std::int64_t ignore_index) {
  if (hidden.dim() != 2 || weight.dim() != 2 || targets.dim() != 1 || hidden.size(1) != weight.size(1) ||
      hidden.size(0) != targets.size(0))
    throw Error("chunked cross-entropy: expected hidden [N, H], weight [V, H] and targets [N]; got hidden " +
                c10::str(hidden.sizes()) + ", weight " + c10::str(weight.sizes()) + ", targets " +
                c10::str(targets.sizes()));
  if (chunk_rows < 1) throw Error("chunked cross-entropy: chunk_rows must be at least 1");
  auto out = ChunkedLinearCrossEntropy::apply(hidden, weight, targets.to(torch::kLong), chunk_rows,
                                              static_cast<std::int64_t>(compute_dtype), ignore_index);
  return {out[0], out[1]};
}

}  // namespace refit
