// The loop's optimizer path against Python PyTorch (tests/golden/make_adamw_cosine.py):
// 50 AdamW steps with warmup-cosine, and gradient accumulation with a partial last window.
#include <cmath>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/linear.h>

#include "io/safetensors.h"
#include "objectives/classification.h"
#include "data_support.h"
#include "numeric_bounds.h"
#include "test_support.h"
#include "train/optimizer.h"
#include "train/trainer.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_golden_loop {

using namespace refit;
using namespace refit::test;

namespace {

io::SafetensorsFile golden() {
  return io::SafetensorsFile::open(test::source_dir() + "/tests/golden/adamw_cosine.safetensors");
}

class Fc : public TensorModel {
 public:
  Fc() { fc = register_module("fc", torch::nn::Linear(6, 4)); }
  torch::Tensor forward(const torch::Tensor& x) override { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};

class Tensors : public LabelledDataset {
 public:
  Tensors(torch::Tensor x, torch::Tensor y) : x_(std::move(x)), y_(std::move(y)) {}
  std::int64_t size() const override { return x_.size(0); }
  Example get(std::int64_t i) const override { return labelled(x_[i], y_[i]); }

 private:
  torch::Tensor x_, y_;
};

struct Run {
  std::vector<StepResult> results;
  std::shared_ptr<Fc> model = std::make_shared<Fc>();
};

class Collect : public Callback {
 public:
  explicit Collect(std::vector<StepResult>& out) : out_(out) {}
  void on_step_end(const TrainState&, const StepResult& r, TrainerControl&) override { out_.push_back(r); }

 private:
  std::vector<StepResult>& out_;
};

Run train(std::int64_t accumulation, Duration duration, SchedulerSpec schedule, bool fused) {
  auto g = golden();
  Run run;
  {
    torch::NoGradGuard ng;
    run.model->fc->weight.copy_(g.load("init.fc.weight"));
    run.model->fc->bias.copy_(g.load("init.fc.bias"));
  }
  ModelRegistry registry(Precision::fp32);
  ModelSpec spec;
  spec.name = "net";
  spec.trainable = true;
  registry.add(run.model, spec, torch::kCPU);
  Registry factories;
  register_classification_objective(factories);
  auto issues = std::make_shared<ConfigIssues>();
  TrainerParts p;
  p.models = &registry;
  p.train = std::make_shared<DataLoader>(std::make_shared<Tensors>(g.load("X"), g.load("y")),
                                         LoaderOptions{8, /*shuffle=*/false, /*drop_last=*/true, 0});
  p.objective = factories.objectives.parse("classification", "/t",
                                           ConfigReader(Json{{"models", {"net"}}}, "/c", issues))(BuildContext{});
  OptimizerSpec o;
  o.type = "adamw";
  o.lr = 0.01;
  o.betas = {0.9, 0.98};
  o.eps = 1e-7;
  o.weight_decay = 0.05;
  o.exempt_1d_and_bias = false;  // the Python reference decays the bias too (one group)
  o.fused = fused;
  p.optimizer = make_optimizer(o, registry.parameter_groups(o));
  p.callbacks = {std::make_shared<Collect>(run.results)};
  p.training.batch_size = 8;
  p.training.gradient_accumulation = accumulation;
  p.training.duration = duration;
  p.scheduler = schedule;
  Trainer(std::move(p)).fit();
  return run;
}

// The golden runs' bounds (numeric_bounds.h): the same updates in double from the fixture's
// inputs — the exact run — and, for each checked value, a probabilistic first-order bound on how
// far an fp32 run of them (ATen's cross entropy and either AdamW kernel, any summation order and
// thread count; refit's or PyTorch's on its own CPU) can be from it.
//
// Each operation of the run rounds each of its output elements e count_e times, each rounding at
// most u P_e in size (P_e: the magnitude the operation works at, e.g. sum |x_i| |w_i| for a dot
// product; a function accurate to 1 ulp, exp or log, errs by up to 2u: 4 in the count, which
// adds squares). A checked value o (a loss, a final weight) moves by d o / d e times an error at
// e, so its first-order error is sum_k delta_k s_k over every rounding k of the run,
// |s_k| <= |d o / d e| P_e: under Higham and Mary's model (numeric_bounds.h, mean-zero roundings
// bounded by u) the Azuma-Hoeffding inequality gives
//     |o - exact| <= lambda u sqrt(sum_e count_e (d o / d e P_e)^2).
// The sensitivities d o / d e come from autograd through the exact run: every operation's output
// carries a zero leaf, whose gradient is that sensitivity. A rounding shared by several elements
// is a leaf of its own, so that its effects add before they are squared: the log of a row's sum
// (read by every class), and AdamW's constants rounded to fp32 once (beta1, 1 - beta1, beta2,
// 1 - beta2, eps for the whole run; 1 - lr wd, lr / bc1 and sqrt(bc2) per step). Summed worst
// case instead, the 50 steps' bound was 52 times the error.
class Roundings {
 public:
  /// value + a zero leaf standing for `count` roundings of at most u * magnitude per element.
  torch::Tensor add(const torch::Tensor& value, const torch::Tensor& magnitude, double count) {
    leaves_.push_back(torch::zeros_like(value).requires_grad_(true));
    weights_.push_back(magnitude.detach().square() * count);
    return value + leaves_.back();
  }
  /// lambda u sqrt(sum_e count_e (d out / d e P_e)^2) for the scalar `out`.
  double bound(const torch::Tensor& out, double u) const {
    const auto grads = torch::autograd::grad({out}, leaves_, {}, /*retain_graph=*/true, /*create_graph=*/false,
                                             /*allow_unused=*/true);
    double sum = 0;
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (grads[i].defined()) sum += (grads[i].square() * weights_[i]).sum().item<double>();
    return kLambda * u * std::sqrt(sum);
  }

 private:
  std::vector<torch::Tensor> leaves_, weights_;
};

struct ExactRun {
  torch::Tensor w, b, w_bound, b_bound;  // exact weights; bounds on |fp32 - exact|
  std::vector<double> loss, loss_bound;  // per update: the window's mean loss
};

ExactRun exact_adamw(const std::vector<std::pair<std::int64_t, std::int64_t>>& windows, const std::vector<double>& lrs) {
  constexpr double b1 = 0.9, b2 = 0.98, eps = 1e-7, wd = 0.05;  // train()'s optimizer
  const double u = kUnitFp32;
  auto g = golden();
  const auto D = torch::kDouble;
  const auto X = g.load("X").to(D), Y = g.load("y").to(torch::kLong);
  const std::int64_t K = X.size(1);
  Roundings rounded;
  torch::Tensor w = g.load("init.fc.weight").to(D), b = g.load("init.fc.bias").to(D);
  const std::int64_t C = w.size(0);
  struct Moments {
    torch::Tensor m, v;
  };
  Moments mw{torch::zeros_like(w), torch::zeros_like(w)}, mb{torch::zeros_like(b), torch::zeros_like(b)};
  // A constant rounded to fp32 once and shared by every element that reads it.
  auto constant = [&](double c, double count) { return rounded.add(torch::tensor(c, D), torch::tensor(c, D), count); };
  // The run's: a lerp's 1 - (1 - beta1) in place of beta1 errs with the other's rounding, so 2
  // each covers both forms.
  const auto beta1 = constant(b1, 2), one_minus_beta1 = constant(1 - b1, 2), beta2 = constant(b2, 2),
             one_minus_beta2 = constant(1 - b2, 2), epsilon = constant(eps, 2);
  std::vector<torch::Tensor> losses;
  for (std::size_t t = 0; t < windows.size(); ++t) {
    const auto [lo, hi] = windows[t];
    const std::int64_t n = hi - lo;
    const auto x = X.slice(0, lo, hi), ax = x.abs();
    const auto y = Y.slice(0, lo, hi).unsqueeze(1);
    // Logits: a dot product of length K plus the bias.
    const auto z = rounded.add(x.mm(w.t()) + b, ax.mm(w.abs().t()) + b.abs(), static_cast<double>(K + 1));
    // Cross entropy as ATen's log_softmax and nll_loss compute it: d = z - max (the max exact),
    // the row's sum S of exp(d) (C - 1 additions), L = log S (shared by the row; its magnitude
    // also covers a kernel forming max + L first), o = d - L, the loss the mean of -o_y over the
    // window (n - 1 additions, a division by n).
    const auto top = std::get<0>(z.detach().max(1, true));
    const auto d = rounded.add(z - top, (z - top).abs(), 1);
    const auto e = rounded.add(d.exp(), d.exp(), 4);
    const auto S = rounded.add(e.sum(1, true), e.sum(1, true), static_cast<double>(C - 1));
    const auto L = rounded.add(S.log(), S.log().abs() + top.abs(), 5);
    const auto o = rounded.add(d - L, (d - L).abs(), 1);
    const auto per = -o.gather(1, y);
    losses.push_back(rounded.add(per.mean(), per.abs().mean(), static_cast<double>(n)));
    // The window's gradient as log_softmax's backward forms it: dz = g - exp(o) sum(g), g = -1/n
    // at the label (sum(g) exact): exp (4), its product with 1/n and the difference (2).
    const auto onehot = torch::zeros_like(z).scatter_(1, y, 1.0);
    const auto p = rounded.add(o.exp(), o.exp(), 4);
    const auto dz = rounded.add((p - onehot) / static_cast<double>(n), (p - onehot).abs() / static_cast<double>(n), 2);
    // Sums over the window's n samples (micro-batches accumulated or one batch: any order).
    const auto gw = rounded.add(dz.t().mm(x), dz.abs().t().mm(ax), static_cast<double>(n));
    const auto gb = rounded.add(dz.sum(0), dz.abs().sum(0), static_cast<double>(n));
    // AdamW as PyTorch writes it: p *= 1 - lr wd; m, v moments; p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),
    // with the step's constants rounded once (3 each: formed in double or fp32) and, per element,
    // the decay 1, m 3 (a lerp, or two products and a sum), v 4, the denominator 3, the step 2,
    // the update 1.
    const double lr = lrs[t], step = static_cast<double>(t + 1);
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    const auto decay = constant(1 - lr * wd, 3), step_size = constant(lr / bc1, 3), bc2_sqrt = constant(std::sqrt(bc2), 3);
    auto update = [&](torch::Tensor& p, const torch::Tensor& grad, Moments& s) {
      const auto decayed = rounded.add(p * decay, (p * decay).abs(), 1);
      s.m = rounded.add(beta1 * s.m + one_minus_beta1 * grad, b1 * s.m.abs() + (1 - b1) * grad.abs(), 3);
      s.v = rounded.add(beta2 * s.v + one_minus_beta2 * grad * grad, b2 * s.v.abs() + (1 - b2) * grad * grad, 4);
      const auto denom = rounded.add(s.v.sqrt() / bc2_sqrt + epsilon, s.v.abs().sqrt() / std::sqrt(bc2) + eps, 3);
      const auto taken = rounded.add(step_size * s.m / denom, (step_size * s.m / denom).abs(), 2);
      p = rounded.add(decayed - taken, (decayed - taken).abs(), 1);
    };
    update(w, gw, mw);
    update(b, gb, mb);
  }
  ExactRun r;
  r.w = w.detach();
  r.b = b.detach();
  // The double run's own error, relative 2^-53 per rounding over far fewer than 10^4 of them.
  auto bounds = [&](const torch::Tensor& p) {
    std::vector<double> out;
    const auto flat = p.reshape({-1});
    for (std::int64_t i = 0; i < flat.numel(); ++i)
      out.push_back(rounded.bound(flat[i], u) + gamma_n(10000, kUnitFp64) * std::abs(flat[i].item<double>()));
    return torch::tensor(out, torch::kDouble).view(p.sizes());
  };
  r.w_bound = bounds(w);
  r.b_bound = bounds(b);
  for (const auto& l : losses) {
    r.loss.push_back(l.item<double>());
    r.loss_bound.push_back(rounded.bound(l, u) + gamma_n(10000, kUnitFp64) * std::abs(l.item<double>()));
  }
  return r;
}

/// Checks a run's final weights (refit's or the fixture's) against the exact run's, within its bound.
void check_weights(const std::string& who, const torch::Tensor& w, const torch::Tensor& b, const ExactRun& exact) {
  const double rw = bound_ratio(w, exact.w, exact.w_bound), rb = bound_ratio(b, exact.b, exact.b_bound);
  INFO("max bound " << exact.w_bound.max().item<double>());
  check_bound_ratio("weight: " + who, rw);
  check_bound_ratio("bias: " + who, rb);
}

}  // namespace

TEST_CASE("50 steps of AdamW with warmup-cosine match PyTorch (golden)") {
  SchedulerSpec s;
  s.type = "cosine";
  s.warmup = 5;
  const bool fused = GENERATE(true, false);  // ATen's fused kernel and the op-for-op path
  INFO("fused " << fused);
  Run run = train(1, {50, TimeUnit::step}, s, fused);
  auto g = golden();
  auto losses = g.load("cosine.losses");
  auto lrs = g.load("cosine.lrs");
  REQUIRE(run.results.size() == 50);
  std::vector<double> lr(50);
  std::vector<std::pair<std::int64_t, std::int64_t>> windows;
  for (int k = 0; k < 50; ++k) {
    lr[k] = lrs[k].item<double>();
    windows.emplace_back((k * 8) % 80, (k * 8) % 80 + 8);  // batches of 8, the 80 samples cycled in order
  }
  // The same for both GENERATE branches: computed once (Catch runs the case's body per branch).
  static const ExactRun exact = exact_adamw(windows, lr);
  for (int k = 0; k < 50; ++k) {
    INFO("step " << k);
    // Both schedules compute in double from the same formula: a few roundings of 2^-53 and glibc's
    // cos (< 1 ulp), each at most the base lr in magnitude: gamma_16(2^-53) * base lr.
    CHECK(std::abs(run.results[k].learning_rates.at(0) - lr[k]) <= gamma_n(16, kUnitFp64) * 0.01);
    const double refit_loss = run.results[k].loss.item<double>(), python_loss = losses[k].item<double>();
    INFO("loss: refit " << refit_loss << ", PyTorch " << python_loss << ", exact " << exact.loss[k] << ", bound "
                        << exact.loss_bound[k]);
    check_bound_ratio("loss: refit", std::abs(refit_loss - exact.loss[k]) / exact.loss_bound[k]);
    check_bound_ratio("loss: PyTorch", std::abs(python_loss - exact.loss[k]) / exact.loss_bound[k]);
  }
  check_weights("refit", run.model->fc->weight, run.model->fc->bias, exact);
  check_weights("PyTorch", g.load("cosine.fc.weight"), g.load("cosine.fc.bias"), exact);
}

TEST_CASE("accumulated micro-batches, partial last window included, match PyTorch's big batches (golden)") {
  SchedulerSpec constant;
  // 10 micro-batches of 8 with k = 4: windows of 32, 32 and a partial 16.
  const bool fused = GENERATE(true, false);
  INFO("fused " << fused);
  Run run = train(4, {10, TimeUnit::step}, constant, fused);
  auto g = golden();
  CHECK(run.results.back().counters.iteration == 3);
  // Windows of 32, 32 and 16 samples at the constant lr; PyTorch took each as one batch.
  static const ExactRun exact = exact_adamw({{0, 32}, {32, 64}, {64, 80}}, {0.01, 0.01, 0.01});  // once, as above
  check_weights("refit", run.model->fc->weight, run.model->fc->bias, exact);
  check_weights("PyTorch", g.load("accumulate.fc.weight"), g.load("accumulate.fc.bias"), exact);
}

}  // namespace refit_test_golden_loop
