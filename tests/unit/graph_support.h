#pragma once
// A small LoRA run for the CUDA-graph tests: the same training with the step replayed from a
// graph and eagerly. Used by tests/unit/test_step_graph.cpp (emulated graphs, CPU) and
// tests/gpu/test_gpu.cpp (real CUDA graphs).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

// c10/util/Logging.h defines a glog-style CHECK macro (abort on failure, not a test assertion);
// included before Catch so that Catch's CHECK is the one every test sees, whatever it includes.
#include <c10/util/Logging.h>
#include <catch2/catch.hpp>

#include "core/plugin_loader.h"
#include "data_support.h"
#include "replaying_step_graph.h"
#include "model/model_registry.h"
#include "objectives/classification.h"
#include "refit/layers.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace refit::test {
/// Sequences pooled over time, then two adaptable layers: frozen bf16 fc1 with LoRA, fp32 fc2.
class PoolNet : public TensorModel {
 public:
  PoolNet() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 32));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return fc2->forward(at::gelu(fc1->forward(x.mean(1)))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

/// Samples [T, 8] with T = 4 below `long_from` and 6 from there on (a batch shape change the
/// graph cannot take); sample `nan_at` holds a NaN.
class SeqData : public test::LabelledDataset {
 public:
  SeqData(std::int64_t n, std::int64_t long_from, std::int64_t nan_at) : n_(n), long_from_(long_from), nan_at_(nan_at) {}
  std::int64_t size() const override { return n_; }
  Example get(std::int64_t i) const override {
    const std::int64_t t = i >= long_from_ ? 6 : 4;
    auto x = torch::sin(torch::arange(t * 8, torch::kFloat).reshape({t, 8}) * (0.1 * static_cast<double>(i + 1)));
    if (i == nan_at_) x[0][0] = NAN;
    return test::labelled(x, torch::tensor(i % 4, torch::kLong));
  }

 private:
  std::int64_t n_, long_from_, nan_at_;
};

struct Outcome {
  std::vector<float> losses;
  std::vector<bool> skipped;
  std::map<std::string, torch::Tensor> weights;  // trainable parameters, on the CPU
  std::int64_t skipped_iterations = 0;
  std::string plan;
};

class Record : public Callback {
 public:
  Outcome* out;
  explicit Record(Outcome* o) : out(o) {}
  void on_step_end(const TrainState&, const StepResult& r, TrainerControl&) override {
    out->losses.push_back(r.loss.item<float>());
    out->skipped.push_back(r.skipped.defined() && r.skipped.item<bool>());  // none inside a window
  }
};

/// 16 steps (2 epochs of 8 batches of 4, no shuffling; `accumulation` micro-batches per update)
/// of LoRA + head training with clipping and
/// a cosine schedule (the learning rate changes every step), `warmup` eager steps before the
/// capture (more than 16: no capture, every step eager with the same device-side learning rate).
inline Outcome train_pool_net(torch::Device device, bool emulate, const char* precision, std::int64_t warmup,
                              std::int64_t long_from, std::int64_t nan_at, std::int64_t accumulation = 1,
                              const std::function<ObjectivePtr(ObjectivePtr)>& wrap_objective = {}) {
  torch::manual_seed(3);
  Registry factories;
  register_classification_objective(factories);
  PluginLoader loader(factories);
  loader.load("lora");
  auto issues = std::make_shared<ConfigIssues>();
  auto lora =
      factories.adapters.parse("lora", "/t",
                               ConfigReader(Json{{"r", 4}, {"alpha", 8}, {"target_regex", "fc1"}, {"init", "gaussian"}},
                                            "/c", issues))(BuildContext{});
  auto net = std::make_shared<PoolNet>();
  lora->attach(*net);
  ModelSpec spec;
  spec.name = "net";
  spec.dtype = c10::kBFloat16;
  spec.rules = lora->parameter_rules();
  spec.rules.push_back(ParameterRule{"fc2\\..*", true, c10::kFloat, "", {}});
  const Precision mode = std::string(precision) == "fp16-mixed" ? Precision::fp16_mixed : Precision::bf16_mixed;
  ModelRegistry registry(mode);
  registry.add(net, spec, device);

  Outcome out;
  TrainerParts p;
  p.models = &registry;
  p.train = std::make_shared<DataLoader>(std::make_shared<SeqData>(32, long_from, nan_at), LoaderOptions{4, false, true, 0});
  p.objective = factories.objectives.parse("classification", "/t",
                                           ConfigReader(Json{{"models", {"net"}}}, "/c", issues))(BuildContext{});
  if (wrap_objective) p.objective = wrap_objective(p.objective);
  OptimizerSpec o;
  o.lr = 3e-3;
  p.optimizer = make_optimizer(o, registry.parameter_groups(o));
  p.scheduler.type = "cosine";
  p.scheduler.warmup = 2;
  p.callbacks = {std::make_shared<Record>(&out)};
  p.training.batch_size = 4;
  p.training.gradient_accumulation = accumulation;
  p.training.duration = Duration{16, TimeUnit::step};
  p.training.clip_grad_norm = 0.5;
  p.training.log_every = 5;
  p.training.cuda_graph = warmup > 0;  // 0: the switch off
  p.training.cuda_graph_warmup = std::max<std::int64_t>(warmup, 1);
  p.precision = mode;
  p.device = device;
  if (emulate) p.make_step_graph = test::replaying_step_graphs();
  Trainer trainer(std::move(p));
  auto summary = trainer.fit();
  out.skipped_iterations = summary.counters.skipped_iterations;
  out.plan = trainer.cuda_graph_plan();
  for (const auto& m : registry.models())
    for (const auto& prm : m.parameters)
      if (prm.trainable) out.weights[prm.path] = prm.tensor.detach().cpu();
  return out;
}

/// `exact`: bit for bit (emulated graphs run the same host code); else to float32 rounding (a GPU
/// replays the same kernels, which should give the same bits too, but cuBLAS may pick another
/// algorithm under capture).
inline void check_same_training(const Outcome& graphed, const Outcome& eager, bool exact) {
  REQUIRE(graphed.losses.size() == eager.losses.size());
  for (std::size_t i = 0; i < eager.losses.size(); ++i) {
    INFO("step " << i);
    if (!std::isfinite(eager.losses[i])) CHECK_FALSE(std::isfinite(graphed.losses[i]));
    else if (exact)
      CHECK(graphed.losses[i] == eager.losses[i]);
    else
      CHECK(graphed.losses[i] == Approx(eager.losses[i]).epsilon(1e-6));
    CHECK(graphed.skipped[i] == eager.skipped[i]);
  }
  CHECK(graphed.skipped_iterations == eager.skipped_iterations);
  REQUIRE(graphed.weights.size() == eager.weights.size());
  REQUIRE(!eager.weights.empty());
  for (const auto& [name, w] : eager.weights) {
    INFO(name);
    CHECK(torch::isfinite(graphed.weights.at(name)).all().item<bool>());
    if (exact) CHECK(torch::equal(graphed.weights.at(name), w));
    else
      CHECK(torch::allclose(graphed.weights.at(name), w, 1e-6, 1e-7));
  }
}

/// Passes through to an objective, throwing at one call, before any work: a capture failing in a
/// way CUDA can close cleanly (an error raised inside the step). (What an invalidated capture
/// does — the run stops — needs a GPU.)
class ThrowsOnce : public Objective {
 public:
  ThrowsOnce(ObjectivePtr inner, int at) : inner_(std::move(inner)), at_(at) {}
  std::vector<std::string> required_models() const override { return inner_->required_models(); }
  LossOutput compute(const ModelMap& m, const Batch& b, const ObjectiveContext& c) override {
    if (calls_++ == at_) throw Error("this forward cannot run in a graph");
    return inner_->compute(m, b, c);
  }
  StepGraphSupport step_graph_support() const override { return {/*replayable=*/true, /*inner_step_hooks=*/false}; }

 private:
  ObjectivePtr inner_;
  int at_;
  int calls_ = 0;
};


/// Wraps the run's objective in ThrowsOnce(call).
inline std::function<ObjectivePtr(ObjectivePtr)> failing_at(int call) {
  return [call](ObjectivePtr o) -> ObjectivePtr { return std::make_shared<ThrowsOnce>(std::move(o), call); };
}

/// Trains twice — eagerly (a warm-up longer than the run: the same device-side learning rate and
/// persistent gradients, no capture) and with graphs after `warmup` steps — and checks the graphed
/// run's plan and that both trained alike. `wrap_objective` applies to the graphed run only.
inline Outcome expect_as_eager(torch::Device device, bool emulate, const std::string& plan, const char* precision,
                               std::int64_t warmup, std::int64_t long_from, std::int64_t nan_at,
                               std::int64_t accumulation = 1,
                               const std::function<ObjectivePtr(ObjectivePtr)>& wrap_objective = {}) {
  auto eager = train_pool_net(device, emulate, precision, 1000, long_from, nan_at, accumulation);
  auto graphed = train_pool_net(device, emulate, precision, warmup, long_from, nan_at, accumulation, wrap_objective);
  CHECK(eager.plan == "on");  // qualifies, but the warm-up outlasts the run
  CHECK(graphed.plan == plan);
  check_same_training(graphed, eager, /*exact=*/emulate);
  // And graph mode's eager path (device-side learning rate, gradients zeroed in place) trains as
  // a run without the switch, to the rounding of a float32 learning rate.
  auto plain = train_pool_net(device, emulate, precision, 0, long_from, nan_at, accumulation);
  CHECK(plain.plan.empty());
  check_same_training(eager, plain, /*exact=*/false);
  return graphed;
}

}  // namespace refit::test
