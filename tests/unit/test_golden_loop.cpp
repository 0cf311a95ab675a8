// The loop's optimizer path against Python PyTorch (tests/golden/make_adamw_cosine.py):
// 50 AdamW steps with warmup-cosine, and gradient accumulation with a partial last window.
#include <cmath>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
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
// inputs — the exact run — and, step by step, a first-order bound on how far an fp32 run of them
// (any kernel, summation order, thread count; refit's or PyTorch's on its own CPU) can be from it.
// Each quantity's bound is the propagated bound of its inputs plus gamma_n(2^-24) times the
// magnitude of the operation that makes it (n: its roundings). First order: products of two
// errors (~1e-14 here) are left out.
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
  ExactRun r;
  r.w = g.load("init.fc.weight").to(D);
  r.b = g.load("init.fc.bias").to(D);
  const std::int64_t C = r.w.size(0);
  r.w_bound = torch::zeros_like(r.w);
  r.b_bound = torch::zeros_like(r.b);
  struct Moments {
    torch::Tensor m, v, em, ev;
  };
  Moments mw{torch::zeros_like(r.w), torch::zeros_like(r.w), torch::zeros_like(r.w), torch::zeros_like(r.w)};
  Moments mb{torch::zeros_like(r.b), torch::zeros_like(r.b), torch::zeros_like(r.b), torch::zeros_like(r.b)};
  for (std::size_t t = 0; t < windows.size(); ++t) {
    const auto [lo, hi] = windows[t];
    const std::int64_t n = hi - lo;
    const auto x = X.slice(0, lo, hi), ax = x.abs();
    const auto y = Y.slice(0, lo, hi).unsqueeze(1);
    // Logits: a dot product of length K plus the bias.
    const auto z = x.mm(r.w.t()) + r.b;
    const auto ez = ax.mm(r.w_bound.t()) + r.b_bound + gamma_n(K + 1, u) * (ax.mm(r.w.abs().t()) + r.b.abs());
    // Cross entropy: log-sum-exp (max, C exps and adds, a log: C + 4 roundings) minus the label's
    // logit; |d lse| <= sum_j p_j |dz_j|; the mean over n adds n roundings.
    const auto p = at::softmax(z, 1), lse = at::logsumexp(z, {1}), zy = z.gather(1, y).squeeze(1);
    const auto per = lse - zy;
    const auto e_per =
        (p * ez).sum(1) + ez.gather(1, y).squeeze(1) + gamma_n(C + 5, u) * (lse.abs() + z.abs().amax(1) + zy.abs());
    r.loss.push_back(per.mean().item<double>());
    r.loss_bound.push_back((e_per.mean() + gamma_n(n, u) * per.abs().mean()).item<double>());
    // The window's gradient: dz = (softmax - onehot) / n; softmax's first-order sensitivity
    // |dp_j| <= p_j (|dz_j| + sum_k p_k |dz_k|), its own roundings (C + 4) and the division.
    const auto onehot = torch::zeros_like(z).scatter_(1, y, 1.0);
    const auto dz = (p - onehot) / static_cast<double>(n);
    const auto edz = (p * (ez + (p * ez).sum(1, true)) + gamma_n(C + 5, u) * p) / static_cast<double>(n);
    // Sums over the window's n samples (micro-batches accumulated or one batch: any order).
    const auto gw = dz.t().mm(x), gb = dz.sum(0);
    const auto egw = edz.t().mm(ax) + gamma_n(n + 1, u) * dz.abs().t().mm(ax);
    const auto egb = edz.sum(0) + gamma_n(n, u) * dz.abs().sum(0);
    // AdamW as PyTorch writes it: p *= 1 - lr wd; m, v moments; p -= lr / bc1 * m / (sqrt(v / bc2) + eps).
    // Roundings counted with one or two spare for constants a kernel may form in fp32 (1 - lr wd,
    // the bias corrections, their square root): decay 3, m 4 (a lerp), v 5, denominator 4, step 6.
    const double lr = lrs[t], step = static_cast<double>(t + 1);
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    auto update = [&](torch::Tensor& w, torch::Tensor& ew, const torch::Tensor& grad, const torch::Tensor& egrad,
                      Moments& s) {
      w = w * (1 - lr * wd);
      ew = ew * (1 - lr * wd) + gamma_n(3, u) * w.abs();
      s.em = b1 * s.em + (1 - b1) * egrad + gamma_n(4, u) * (b1 * s.m.abs() + (1 - b1) * grad.abs());
      s.ev = b2 * s.ev + (1 - b2) * 2 * grad.abs() * egrad + gamma_n(5, u) * (b2 * s.v + (1 - b2) * grad * grad);
      s.m = b1 * s.m + (1 - b1) * grad;
      s.v = b2 * s.v + (1 - b2) * grad * grad;
      const auto vh = s.v / bc2, evh = s.ev / bc2;
      const auto denom = vh.sqrt() + eps;
      // |sqrt(a + d) - sqrt(a)| <= min(d / (2 sqrt(a)), sqrt(d)).
      const auto edenom = at::minimum(evh / (2 * vh.sqrt()).clamp_min(1e-300), evh.sqrt()) + gamma_n(4, u) * denom;
      const auto step_ = (lr / bc1) * s.m / denom;
      const auto estep = (lr / bc1) * (s.em / denom + s.m.abs() * edenom / (denom * denom)) + gamma_n(6, u) * step_.abs();
      w = w - step_;
      ew = ew + estep + gamma_n(1, u) * w.abs();
    };
    update(r.w, r.w_bound, gw, egw, mw);
    update(r.b, r.b_bound, gb, egb, mb);
  }
  // The double run's own error, relative 2^-53 per rounding over far fewer than 10^4 of them.
  r.w_bound += gamma_n(10000, kUnitFp64) * r.w.abs();
  r.b_bound += gamma_n(10000, kUnitFp64) * r.b.abs();
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
  const ExactRun exact = exact_adamw(windows, lr);
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
  const ExactRun exact = exact_adamw({{0, 32}, {32, 64}, {64, 80}}, {0.01, 0.01, 0.01});
  check_weights("refit", run.model->fc->weight, run.model->fc->bias, exact);
  check_weights("PyTorch", g.load("accumulate.fc.weight"), g.load("accumulate.fc.bias"), exact);
}

}  // namespace refit_test_golden_loop
