#include "callbacks/ema.h"

#include <cmath>

#include <ATen/ATen.h>

namespace refit {

double ema_momentum(const EmaSpec& spec, std::int64_t iteration, std::int64_t total) {
  if (spec.schedule == "constant" || total <= 0) return spec.momentum;
  // DINO's cosine_scheduler: final + (base - final) * (1 + cos(pi * i / total)) / 2.
  const double progress = static_cast<double>(iteration) / static_cast<double>(total);
  return spec.final_momentum + 0.5 * (spec.momentum - spec.final_momentum) * (1.0 + std::cos(M_PI * progress));
}

EmaCallback::EmaCallback(const ModelRegistry& models) {
  for (const auto& m : models.models()) {
    if (!m.ema) continue;
    Track t{*m.ema, {}, {}};
    for (const auto& p : m.parameters)
      if (p.ema_source.defined()) {
        t.ema.push_back(p.tensor);
        t.source.push_back(p.ema_source);
      }
    if (!t.ema.empty()) tracks_.push_back(std::move(t));
  }
}

void EmaCallback::on_optimizer_step_end(const TrainState& state, const StepResult& result, TrainerControl&) {
  torch::NoGradGuard no_grad;
  const std::int64_t iteration = result.counters.iteration - 1;  // the update just attempted
  for (auto& t : tracks_) {
    const double m = ema_momentum(t.spec, iteration, state.max_iterations);
    // DINO: param_k.mul_(m).add_((1 - m) * param_q); same operations, same rounding. The copies
    // are float32 (the registry's rule); a bf16 source under bf16-true promotes into them.
    if (!result.skipped.defined()) {
      at::_foreach_mul_(t.ema, m);
      at::_foreach_add_(t.ema, at::_foreach_mul(t.source, 1.0 - m));
      continue;
    }
    // m_eff = skipped ? 1 : m, a float32 device scalar: no host read of `skipped`.
    torch::Tensor keep = at::where(result.skipped.to(t.ema.front().device()), 1.0, m).to(torch::kFloat);
    at::_foreach_mul_(t.ema, keep);
    at::_foreach_add_(t.ema, at::_foreach_mul(t.source, 1.0 - keep));
  }
}

}  // namespace refit
