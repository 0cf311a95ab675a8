// The loop's optimizer path against Python PyTorch (tests/golden/make_adamw_cosine.py):
// 50 AdamW steps with warmup-cosine, and gradient accumulation with a partial last window.
#include <torch/nn/modules/linear.h>

#include "io/safetensors.h"
#include "objectives/classification.h"
#include "data_support.h"
#include "test_support.h"
#include "train/optimizer.h"
#include "train/trainer.h"

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
  p.objective = factories.objectives.parse("classification", "/t", ConfigReader(Json{{"models", {"net"}}}, "/c", issues))(
      BuildContext{});
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

/// max |a - b| / max(|b|, tiny) over all elements.
double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kDouble) - b.to(torch::kDouble)).abs() / b.to(torch::kDouble).abs().clamp_min(1e-3))
      .max()
      .item<double>();
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
  for (int k = 0; k < 50; ++k) {
    INFO("step " << k);
    CHECK(run.results[k].learning_rates.at(0) == Approx(lrs[k].item<double>()).epsilon(1e-12).margin(1e-15));
    CHECK(run.results[k].loss.item<double>() == Approx(losses[k].item<double>()).epsilon(1e-6));
  }
  CHECK(max_rel(run.model->fc->weight, g.load("cosine.fc.weight")) <= 1e-6);
  CHECK(max_rel(run.model->fc->bias, g.load("cosine.fc.bias")) <= 1e-6);
}

TEST_CASE("accumulated micro-batches, partial last window included, match PyTorch's big batches (golden)") {
  SchedulerSpec constant;
  // 10 micro-batches of 8 with k = 4: windows of 32, 32 and a partial 16.
  const bool fused = GENERATE(true, false);
  INFO("fused " << fused);
  Run run = train(4, {10, TimeUnit::step}, constant, fused);
  auto g = golden();
  CHECK(run.results.back().counters.iteration == 3);
  CHECK(max_rel(run.model->fc->weight, g.load("accumulate.fc.weight")) <= 1e-6);
  CHECK(max_rel(run.model->fc->bias, g.load("accumulate.fc.bias")) <= 1e-6);
}
