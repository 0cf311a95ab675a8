// "linear_probe": logistic regression (one linear layer, cross entropy, Adam) trained on the
// frozen features of a labelled bank; its accuracy on a labelled query set.
//
// Deterministic for a given EvaluatorContext::seed: the layer is initialised from a CPU
// generator seeded from it (PyTorch's nn.Linear init, U(-1/sqrt(D), 1/sqrt(D))), the batches
// are drawn by an explicit Fisher-Yates shuffle on mt19937_64 (std::shuffle's algorithm is
// implementation-defined), and training runs in fp32 with autocast off.
#include <cmath>
#include <numeric>
#include <random>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include "refit/shuffle.h"
#include "evaluators/evaluators.h"
#include "evaluators/features.h"
#include "precision/autocast_guard.h"
#include "refit/error.h"

namespace refit {

namespace {

struct ProbeOptions {
  std::int64_t epochs = 100;
  double lr = 0.01;
  std::int64_t batch_size = 256;
  double weight_decay = 0.0;
  bool normalize = false;
};

/// torch.optim.Adam (betas 0.9, 0.999, eps 1e-8, L2 weight decay added to the gradient), one
/// tensor, the single-tensor path's arithmetic.
class Adam {
 public:
  Adam(double lr, double weight_decay) : lr_(lr), weight_decay_(weight_decay) {}

  void step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads) {
    torch::NoGradGuard no_grad;
    if (exp_avg_.empty())
      for (const auto& p : params) {
        exp_avg_.push_back(torch::zeros_like(p));
        exp_avg_sq_.push_back(torch::zeros_like(p));
      }
    ++step_;
    const double bias1 = 1.0 - std::pow(kBeta1, static_cast<double>(step_));
    const double bias2 = 1.0 - std::pow(kBeta2, static_cast<double>(step_));
    for (std::size_t i = 0; i < params.size(); ++i) {
      torch::Tensor g = weight_decay_ != 0.0 ? grads[i].add(params[i], weight_decay_) : grads[i];
      exp_avg_[i].lerp_(g, 1.0 - kBeta1);
      exp_avg_sq_[i].mul_(kBeta2).addcmul_(g, g, 1.0 - kBeta2);
      torch::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bias2)).add_(kEps);
      params[i].addcdiv_(exp_avg_[i], denom, -lr_ / bias1);
    }
  }

 private:
  static constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  double lr_, weight_decay_;
  std::int64_t step_ = 0;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
};

class LinearProbeEvaluator : public FeatureSetsEvaluator {
 public:
  LinearProbeEvaluator(FeatureSetsConfig sets, ProbeOptions options) : FeatureSetsEvaluator(std::move(sets)), o_(options) {}

  std::map<std::string, double> evaluate(const ModelMap& models, const EvaluatorContext& context) override {
    // Features once, under the caller's no_grad and autocast (the models' own precision).
    auto [bank, queries, classes] = features(models, context);
    if (bank.x.size(1) != queries.x.size(1))
      throw Error("linear_probe: bank features have " + std::to_string(bank.x.size(1)) + " dimensions, queries " +
                  std::to_string(queries.x.size(1)));
    torch::Tensor x = o_.normalize ? l2_normalize(bank.x) : bank.x;
    torch::Tensor xq = o_.normalize ? l2_normalize(queries.x) : queries.x;
    const torch::Tensor& y = bank.labels;
    const std::int64_t n = x.size(0), d = x.size(1);
    const torch::Device device = x.device();

    // Training: gradients on, autocast off, fp32.
    torch::AutoGradMode grad_mode(true);
    AutocastOff no_autocast(device.type());
    const std::uint64_t seed = context.seed * 0x9E3779B97F4A7C15ULL + 0x6C696E6561725F70ULL;  // "linear_p"
    auto init = at::make_generator<at::CPUGeneratorImpl>(seed);
    const double bound = 1.0 / std::sqrt(static_cast<double>(d));
    torch::Tensor weight = torch::empty({classes, d}, torch::kFloat).uniform_(-bound, bound, init);
    torch::Tensor bias = torch::empty({classes}, torch::kFloat).uniform_(-bound, bound, init);
    weight = weight.to(device).requires_grad_(true);
    bias = bias.to(device).requires_grad_(true);
    Adam adam(o_.lr, o_.weight_decay);

    std::mt19937_64 rng(seed ^ 0x5851F42D4C957F2DULL);
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), std::int64_t{0});
    for (std::int64_t epoch = 0; epoch < o_.epochs; ++epoch) {
      seeded_shuffle(order, rng);
      torch::Tensor perm = at::from_blob(order.data(), {n}, torch::kLong).clone().to(device);
      for (std::int64_t start = 0; start < n; start += o_.batch_size) {
        torch::Tensor idx = perm.narrow(0, start, std::min(o_.batch_size, n - start));
        torch::Tensor logits = torch::addmm(bias, x.index_select(0, idx), weight.t());
        torch::Tensor loss = at::cross_entropy_loss(logits, y.index_select(0, idx));
        auto grads = torch::autograd::grad({loss}, {weight, bias});
        adam.step({weight, bias}, grads);
      }
    }

    torch::NoGradGuard no_grad;
    torch::Tensor predicted = torch::addmm(bias, xq, weight.t()).argmax(1);
    const double accuracy = predicted.eq(queries.labels).to(torch::kDouble).mean().item<double>();
    return {{sets_.metric, accuracy}};
  }

 private:
  ProbeOptions o_;
};

}  // namespace

void register_linear_probe_evaluator(Registry& registry) {
  registry.evaluators.add(
      "linear_probe",
      "logistic regression (Adam, cross entropy) on frozen features of models (a chain) of data set bank, "
      "accuracy on data set queries; keys epochs, lr, batch_size, weight_decay, normalize, metric",
      [](const ConfigReader& c) -> Builder<Evaluator> {
        FeatureSetsConfig sets = read_feature_sets_config(c, "linear_probe_accuracy");
        ProbeOptions o;
        o.epochs = c.number_in<std::int64_t>("epochs", o.epochs, 1, 1000000);
        o.lr = c.number_in<double>("lr", o.lr, 0.0, 1e3);
        o.batch_size = c.number_in<std::int64_t>("batch_size", o.batch_size, 1, std::int64_t{1} << 24);
        o.weight_decay = c.number_in<double>("weight_decay", o.weight_decay, 0.0, 1e3);
        o.normalize = c.optional<bool>("normalize", o.normalize);
        return [sets, o](const BuildContext&) { return std::make_shared<LinearProbeEvaluator>(sets, o); };
      });
}

}  // namespace refit
