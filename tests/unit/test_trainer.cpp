// The loop: hook order, accumulation equivalence, non-finite steps skipped and counted.
#include <algorithm>
#include <cmath>

#include <torch/nn/modules/linear.h>

#include "callbacks/ema.h"
#include "objectives/classification.h"
#include "data_support.h"
#include "replaying_step_graph.h"
#include "test_support.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/trainer.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_trainer {

using namespace refit;
using namespace refit::test;

namespace {

class Net : public TensorModel {
 public:
  Net() { fc = register_module("fc", torch::nn::Linear(4, 3)); }
  torch::Tensor forward(const torch::Tensor& x) override {
    modes.push_back({is_training(), torch::GradMode::is_enabled()});
    return fc->forward(x);
  }
  torch::nn::Linear fc{nullptr};
  std::vector<std::pair<bool, bool>> modes;  // (training, grad enabled) per forward
};

/// Deterministic data; sample `nan_at` (if >= 0) has a NaN feature.
class Data : public LabelledDataset {
 public:
  explicit Data(std::int64_t n, std::int64_t nan_at = -1) : n_(n), nan_at_(nan_at) {}
  std::int64_t size() const override { return n_; }
  Example get(std::int64_t i) const override {
    auto x = torch::tensor({std::sin(i * 1.0), std::cos(i * 0.7), std::sin(i * 0.3) * 2, 1.0 * (i % 5)}, torch::kFloat);
    if (i == nan_at_) x[0] = NAN;
    return labelled(x, torch::tensor(i % 3, torch::kLong));
  }

 private:
  std::int64_t n_, nan_at_;
};

class Recorder : public Callback {
 public:
  std::vector<std::string> events;
  void on_train_begin(const TrainState&, TrainerControl&) override { events.push_back("train_begin"); }
  void on_train_end(const TrainState&, TrainerControl&) override { events.push_back("train_end"); }
  void on_epoch_begin(const TrainState&, TrainerControl&) override { events.push_back("epoch_begin"); }
  void on_epoch_end(const TrainState&, TrainerControl&) override { events.push_back("epoch_end"); }
  void on_step_begin(const TrainState&, TrainerControl&) override { events.push_back("step_begin"); }
  void on_compute_loss_begin(const TrainState&, TrainerControl&) override { events.push_back("loss_begin"); }
  void on_compute_loss_end(const TrainState&, TrainerControl&) override { events.push_back("loss_end"); }
  void on_backward_begin(const TrainState&, TrainerControl&) override { events.push_back("backward_begin"); }
  void on_backward_end(const TrainState&, TrainerControl&) override { events.push_back("backward_end"); }
  void on_before_optimizer_step(const TrainState&, TrainerControl&) override { events.push_back("before_optimizer"); }
  void on_optimizer_step_end(const TrainState&, const StepResult&, TrainerControl&) override {
    events.push_back("optimizer_end");
  }
  void on_step_end(const TrainState&, const StepResult& r, TrainerControl&) override {
    events.push_back("step_end");
    results.push_back(r);
  }
  void on_evaluation_begin(const TrainState&, TrainerControl&) override { events.push_back("eval_begin"); }
  void on_evaluation_end(const TrainState&, const EvalResult&, TrainerControl&) override { events.push_back("eval_end"); }
  std::vector<StepResult> results;
};

struct Fixture {
  std::shared_ptr<Net> net = std::make_shared<Net>();
  Precision precision = Precision::fp32;  // set before the first trainer()
  bool drop_last = true;                  // the training loader's
  ModelRegistry registry{precision};
  std::shared_ptr<Recorder> recorder = std::make_shared<Recorder>();
  std::vector<CallbackPtr> first;  // callbacks that run before the recorder
  ObjectivePtr objective;          // default: classification over "net"
  SchedulerSpec schedule;          // default: constant
  StepGraphFactory graphs;         // set: CUDA graphs emulated on the CPU (replaying_step_graph.h)

  std::unique_ptr<Trainer> trainer(TrainingSpec t, std::shared_ptr<Dataset> data, bool with_val = false,
                                   const std::string& optimizer = "sgd") {
    if (registry.models().empty()) {
      registry = ModelRegistry{precision};
      ModelSpec spec;
      spec.name = "net";
      spec.trainable = true;
      registry.add(net, spec, torch::kCPU);
    }
    Registry factories;
    register_classification_objective(factories);
    auto issues = std::make_shared<ConfigIssues>();
    TrainerParts p;
    p.models = &registry;
    p.train = std::make_shared<DataLoader>(data, LoaderOptions{t.batch_size, false, drop_last, 0});
    if (with_val) p.val = std::make_shared<DataLoader>(data, LoaderOptions{t.batch_size, false, false, 0});
    p.objective = objective
                      ? objective
                      : factories.objectives.parse("classification", "/t",
                                                   ConfigReader(Json{{"models", {"net"}}}, "/c", issues))(BuildContext{});
    OptimizerSpec o;
    o.type = optimizer;
    o.lr = 0.1;
    o.weight_decay = 0;
    p.optimizer = make_optimizer(o, registry.parameter_groups(o));
    p.callbacks = first;
    p.callbacks.push_back(recorder);
    p.training = t;
    p.scheduler = schedule;
    p.make_step_graph = graphs;
    p.precision = precision;
    return std::make_unique<Trainer>(std::move(p));
  }
};

TrainingSpec spec(std::int64_t batch, std::int64_t accumulation, Duration d) {
  TrainingSpec t;
  t.batch_size = batch;
  t.gradient_accumulation = accumulation;
  t.duration = d;
  return t;
}

}  // namespace

TEST_CASE("hooks fire in the documented order") {
  Fixture f;
  auto t = spec(4, 2, {1, TimeUnit::epoch});
  t.eval_every = Duration{1, TimeUnit::epoch};
  f.trainer(t, std::make_shared<Data>(8), /*with_val=*/true)->fit();
  std::vector<std::string> micro = {"step_begin", "loss_begin", "loss_end", "backward_begin", "backward_end"};
  std::vector<std::string> expected = {"train_begin", "epoch_begin"};
  expected.insert(expected.end(), micro.begin(), micro.end());
  expected.push_back("step_end");
  expected.insert(expected.end(), micro.begin(), micro.end());
  for (auto e : {"before_optimizer", "optimizer_end", "step_end", "epoch_end", "eval_begin", "eval_end", "train_end"})
    expected.push_back(e);
  CHECK(f.recorder->events == expected);
}

TEST_CASE("k accumulated micro-batches give the update of one k-times-larger batch") {
  Fixture a, b;
  torch::NoGradGuard ng;
  b.net->fc->weight.copy_(a.net->fc->weight);
  b.net->fc->bias.copy_(a.net->fc->bias);
  {
    torch::GradMode::set_enabled(true);
    a.trainer(spec(24, 1, {1, TimeUnit::iteration}), std::make_shared<Data>(24), false, "adamw")->fit();
    b.trainer(spec(6, 4, {1, TimeUnit::iteration}), std::make_shared<Data>(24), false, "adamw")->fit();
  }
  CHECK(torch::allclose(a.net->fc->weight, b.net->fc->weight, 1e-6, 1e-7));
  CHECK(torch::allclose(a.net->fc->bias, b.net->fc->bias, 1e-6, 1e-7));
  REQUIRE(b.recorder->results.size() == 4);
  CHECK(b.recorder->results[3].window_complete);
  CHECK_FALSE(b.recorder->results[2].window_complete);
  CHECK(a.recorder->results[0].grad_norm_before.item<double>() ==
        Approx(b.recorder->results[3].grad_norm_before.item<double>()).epsilon(1e-5));
}

TEST_CASE("micro-batches of different sizes in one window give the update of the whole window as one batch") {
  // 8 samples in micro-batches of 3, 3 and 2 (no drop_last): each is weighted by its share of the
  // window's 8 samples. A mean of the three micro-batch means would weight the last two samples
  // 1.5x and the first six 0.89x.
  Fixture a, b;
  torch::NoGradGuard ng;
  b.net->fc->weight.copy_(a.net->fc->weight);
  b.net->fc->bias.copy_(a.net->fc->bias);
  b.drop_last = false;
  {
    torch::GradMode::set_enabled(true);
    a.trainer(spec(8, 1, {1, TimeUnit::iteration}), std::make_shared<Data>(8))->fit();
    b.trainer(spec(3, 3, {1, TimeUnit::iteration}), std::make_shared<Data>(8))->fit();
  }
  REQUIRE(b.recorder->results.size() == 3);
  CHECK(b.recorder->results[2].window_complete);
  CHECK(torch::allclose(a.net->fc->weight, b.net->fc->weight, 1e-6, 1e-7));
  CHECK(torch::allclose(a.net->fc->bias, b.net->fc->bias, 1e-6, 1e-7));
}

TEST_CASE("a NaN loss is skipped and counted, the weights stay untouched") {
  Fixture f;
  auto before = f.net->fc->weight.detach().clone();
  // Batch 1 (samples 4..7) contains sample 5 with a NaN feature.
  auto trainer = f.trainer(spec(4, 1, {3, TimeUnit::step}), std::make_shared<Data>(12, 5));
  auto summary = trainer->fit();
  CHECK(summary.counters.skipped_iterations == 1);
  CHECK(summary.counters.iteration == 3);
  REQUIRE(f.recorder->results.size() == 3);
  CHECK_FALSE(f.recorder->results[0].skipped.item<bool>());
  CHECK(f.recorder->results[1].skipped.item<bool>());
  CHECK(f.recorder->results[1].skip_reason == "non-finite gradients");
  CHECK(torch::isfinite(f.net->fc->weight).all().item<bool>());
  CHECK_FALSE(torch::equal(before, f.net->fc->weight));  // steps 0 and 2 did update

  Fixture g;
  auto t = spec(4, 1, {3, TimeUnit::step});
  t.non_finite = NonFinitePolicy::raise;
  auto before_g = g.net->fc->weight.detach().clone();
  auto strict = g.trainer(t, std::make_shared<Data>(12, 1));
  CHECK_THROWS_WITH(strict->fit(), Catch::Contains("non-finite gradients at iteration 0"));
  CHECK(torch::equal(before_g, g.net->fc->weight));
}

/// Snapshots a tensor after every optimizer update.
class Snapshots : public Callback {
 public:
  explicit Snapshots(torch::Tensor t) : watched(std::move(t)) {}
  void on_optimizer_step_end(const TrainState&, const StepResult&, TrainerControl&) override {
    taken.push_back(watched.detach().clone());
  }
  torch::Tensor watched;
  std::vector<torch::Tensor> taken;
};

TEST_CASE("fused AdamW skips a NaN window on the device: counted, weights and EMA models untouched") {
  Fixture f;
  f.registry.add(f.net, ModelSpec{"net", true}, torch::kCPU);
  auto ema = std::make_shared<Net>();
  f.registry.add_ema(ema, ModelSpec{"net_ema", false}, EmaSpec{"net", 0.5, 0.5, "constant"}, torch::kCPU);
  auto student = std::make_shared<Snapshots>(f.net->fc->weight);
  auto teacher = std::make_shared<Snapshots>(ema->fc->weight);
  f.first = {std::make_shared<EmaCallback>(f.registry), student, teacher};
  const auto start = f.net->fc->weight.detach().clone();
  // Windows of 2 batches of 4: window 1 (samples 8..15) holds sample 9 with a NaN feature.
  auto trainer = f.trainer(spec(4, 2, {6, TimeUnit::step}), std::make_shared<Data>(24, 9), false, "adamw");
  auto summary = trainer->fit();
  CHECK(summary.counters.skipped_iterations == 1);  // counted on the device, read at the end
  REQUIRE(student->taken.size() == 3);
  CHECK_FALSE(torch::equal(student->taken[0], start));
  CHECK(torch::equal(student->taken[1], student->taken[0]));  // skipped: the kernel left it alone
  CHECK_FALSE(torch::equal(student->taken[2], student->taken[1]));
  CHECK(torch::equal(teacher->taken[1], teacher->taken[0]));  // and the EMA did not move
  CHECK_FALSE(torch::equal(teacher->taken[2], teacher->taken[1]));
  CHECK(torch::isfinite(f.net->fc->weight).all().item<bool>());
  CHECK(torch::isfinite(ema->fc->weight).all().item<bool>());
  CHECK(f.recorder->results[3].skipped.item<bool>());
}

TEST_CASE("clipping reports the unscaled norm before and after") {
  Fixture f;
  auto t = spec(8, 1, {1, TimeUnit::step});
  t.clip_grad_norm = 1e-3;
  f.trainer(t, std::make_shared<Data>(8))->fit();
  const auto& r = f.recorder->results.at(0);
  CHECK(r.grad_norm_before.item<double>() > 1e-3);
  CHECK(r.grad_norm_after.item<double>() == Approx(1e-3).epsilon(1e-3));
}

TEST_CASE("clipping under fp16-mixed sees the unscaled gradients") {
  // The loss is scaled by 2^16 for the backward; the norm and the clipping must come after the
  // unscale. Clipping at 100 then leaves the true gradient (norm ~1) alone; before the unscale it
  // would see a norm ~65536 and shrink the update ~600x (and report the scaled norm).
  auto t = spec(8, 1, {1, TimeUnit::step});
  t.clip_grad_norm = 100.0;
  torch::manual_seed(7);
  Fixture half;
  half.precision = Precision::fp16_mixed;
  half.trainer(t, std::make_shared<Data>(8))->fit();
  torch::manual_seed(7);
  Fixture full;  // the same initial weights, fp32
  full.trainer(t, std::make_shared<Data>(8))->fit();
  const auto& r = half.recorder->results.at(0);
  const double norm = r.grad_norm_before.item<double>(),
               fp32_norm = full.recorder->results.at(0).grad_norm_before.item<double>();
  CHECK(r.scale_before.item<double>() == 65536.0);
  CHECK(norm == Approx(fp32_norm).epsilon(1e-2));   // fp16 products: a few 2^-11
  CHECK(r.grad_norm_after.item<double>() == norm);  // not clipped
  CHECK(torch::allclose(half.net->fc->weight, full.net->fc->weight, 1e-2, 1e-3));
}

TEST_CASE("schedules are pure functions of the iteration") {
  SchedulerSpec s;
  s.type = "cosine";
  s.warmup = 10;
  CHECK(lr_factor(s, 0, 110) == 0.0);
  CHECK(lr_factor(s, 5, 110) == Approx(0.5));
  CHECK(lr_factor(s, 10, 110) == Approx(1.0));
  CHECK(lr_factor(s, 60, 110) == Approx(0.5));
  CHECK(lr_factor(s, 110, 110) == Approx(0.0).margin(1e-12));
  s.type = "linear";
  s.min_lr_ratio = 0.1;
  CHECK(lr_factor(s, 60, 110) == Approx(0.55));
  s.type = "step";
  s.warmup = 0;
  s.step_size = 10;
  s.gamma = 0.5;
  CHECK(lr_factor(s, 25, 100) == Approx(0.25));
}

TEST_CASE("durations parse N:unit and nothing else") {
  CHECK(parse_duration("10:step") == Duration{10, TimeUnit::step});
  CHECK(parse_duration("3:epoch") == Duration{3, TimeUnit::epoch});
  CHECK(parse_duration("2:iteration") == Duration{2, TimeUnit::iteration});
  for (auto bad : {"10 steps", "0:step", "-1:step", ":step", "5:", "5:steps", "1e3:step"}) {
    INFO(bad);
    CHECK_FALSE(parse_duration(bad).has_value());
  }
  CHECK(steps_for({2, TimeUnit::epoch}, 7, 3) == 14);
  CHECK(steps_for({2, TimeUnit::iteration}, 7, 3) == 6);
}

TEST_CASE("evaluation runs without grad, in eval mode, and restores train mode and the RNG stream") {
  Fixture f;
  auto t = spec(4, 1, {2, TimeUnit::step});
  t.eval_every = Duration{1, TimeUnit::step};
  auto trainer = f.trainer(t, std::make_shared<Data>(8), /*with_val=*/true);
  torch::manual_seed(42);
  auto expected_next = torch::rand({1}).item<float>();
  torch::manual_seed(42);
  trainer->evaluate(DataLoader(std::make_shared<Data>(8), LoaderOptions{4, false, false, 0}));
  CHECK(torch::rand({1}).item<float>() == expected_next);  // evaluation drew nothing from the stream
  f.net->modes.clear();
  trainer->fit();
  // train, eval x2, train, eval x2, (final eval skipped: already evaluated at the last step)
  std::vector<std::pair<bool, bool>> expected{{true, true}, {false, false}, {false, false},
                                              {true, true}, {false, false}, {false, false}};
  CHECK(f.net->modes == expected);
  CHECK(f.net->is_training());
}

namespace {

class InsideHooks : public Callback {
 public:
  StepGraphSupport step_graph_support() const override { return {/*replayable=*/true, /*inner_step_hooks=*/true}; }
};

/// Classification that does not declare itself graph-safe (the default).
class UndeclaredObjective : public Objective {
 public:
  std::vector<std::string> required_models() const override { return {"net"}; }
  LossOutput compute(const ModelMap& models, const Batch& batch, const ObjectiveContext&) override {
    auto logits = tensor_model(models.at("net"))->forward(input_of(batch));
    return LossOutput{at::cross_entropy_loss(logits, label_of(batch), {}, at::Reduction::Sum), batch.size(), {}};
  }
};

std::string plan(Fixture& f, TrainingSpec t, const std::string& optimizer = "adamw") {
  t.cuda_graph = true;
  return f.trainer(t, std::make_shared<Data>(8), false, optimizer)->cuda_graph_plan();
}

}  // namespace

TEST_CASE("cuda_graph: the plan says why a run stays eager") {
  const auto t = spec(4, 1, {2, TimeUnit::step});
  {
    Fixture f;
    CHECK(f.trainer(t, std::make_shared<Data>(8), false, "adamw")->cuda_graph_plan().empty());  // not asked for
    CHECK(plan(f, t) == "off: CUDA graphs need a CUDA device (this run is on cpu)");
    CHECK(plan(f, t, "sgd") == "off: the optimizer is not a fused Adam/AdamW (it reads found-inf on the host)");
    // Accumulation windows qualify (an accumulate graph and an update graph).
    CHECK(plan(f, spec(4, 2, {2, TimeUnit::step})) == "off: CUDA graphs need a CUDA device (this run is on cpu)");
    auto raise = t;
    raise.non_finite = NonFinitePolicy::raise;
    CHECK(plan(f, raise) == "off: non_finite \"raise\" reads found-inf on the host every update");
  }
  {
    Fixture f;
    f.first.push_back(std::make_shared<InsideHooks>());
    CHECK(plan(f, t) == "off: a callback needs the hooks inside the step (StepGraphSupport::inner_step_hooks)");
  }
  {
    Fixture f;
    f.objective = std::make_shared<UndeclaredObjective>();
    CHECK(plan(f, t) == "off: the objective is not replayable (StepGraphSupport::replayable)");
  }
}

TEST_CASE("cuda_graph on a CPU: the plan is off and the run eager with every hook, graphed runs lack the inner hooks") {
  // The same recipe three ways: without the switch; with it on this CPU (no CUDA: the plan says
  // off and the run is eager, so the hooks inside the step fire for every step); with it and
  // graphs emulated (the graph path: after the warm-up, steps replay, and in graph mode the hooks
  // inside the step fire for no step). The third run is the control: it shows the hook counts
  // below tell the two paths apart, so a CPU run that took the graph path would fail here.
  Fixture plain, cpu, emulated;
  {
    torch::NoGradGuard ng;
    for (Fixture* f : {&cpu, &emulated}) {
      f->net->fc->weight.copy_(plain.net->fc->weight);
      f->net->fc->bias.copy_(plain.net->fc->bias);
    }
  }
  auto t = spec(4, 1, {6, TimeUnit::step});
  plain.trainer(t, std::make_shared<Data>(8), false, "adamw")->fit();
  t.cuda_graph = true;
  t.cuda_graph_warmup = 2;
  auto on_cpu = cpu.trainer(t, std::make_shared<Data>(8), false, "adamw");
  CHECK(on_cpu->cuda_graph_plan() == "off: CUDA graphs need a CUDA device (this run is on cpu)");
  on_cpu->fit();
  emulated.graphs = test::replaying_step_graphs();
  auto graphed = emulated.trainer(t, std::make_shared<Data>(8), false, "adamw");
  CHECK(graphed->cuda_graph_plan() == "on");
  graphed->fit();
  CHECK(graphed->cuda_graph_plan() == "on: step 2 captured; 3 replays, 2 eager steps");

  auto count = [](const Fixture& f, const char* event) {
    return std::count(f.recorder->events.begin(), f.recorder->events.end(), std::string(event));
  };
  for (const char* inner : {"loss_begin", "loss_end", "backward_begin", "backward_end", "before_optimizer"}) {
    INFO(inner);
    CHECK(count(cpu, inner) == 6);       // eager: every step
    CHECK(count(emulated, inner) == 0);  // graph mode: none
  }
  CHECK(cpu.recorder->events == plain.recorder->events);
  CHECK(count(emulated, "step_end") == 6);
  // Same updates either way (the emulated graph re-runs the same host code).
  CHECK(torch::equal(cpu.net->fc->weight, plain.net->fc->weight));
  CHECK(torch::equal(emulated.net->fc->weight, plain.net->fc->weight));
}

namespace {

/// Classification plus fc.bias.sum() times a factor that is +inf at call `inf_at`: that step's
/// bias gradients are +inf (not NaN), the case value clipping would hide.
class InfGradientObjective : public Objective {
 public:
  explicit InfGradientObjective(int inf_at) : inf_at_(inf_at) {}
  std::vector<std::string> required_models() const override { return {"net"}; }
  LossOutput compute(const ModelMap& models, const Batch& batch, const ObjectiveContext&) override {
    auto net = std::dynamic_pointer_cast<Net>(models.at("net"));
    auto loss = at::cross_entropy_loss(net->forward(input_of(batch)), label_of(batch), {}, at::Reduction::Sum);
    const double factor = calls_++ == inf_at_ ? INFINITY : 0.0;
    return LossOutput{loss + net->fc->bias.sum() * factor, batch.size(), {}};
  }

 private:
  int inf_at_, calls_ = 0;
};

}  // namespace

TEST_CASE("value clipping never turns an inf gradient into an update: the window is skipped") {
  for (const char* optimizer : {"sgd", "adamw"}) {
    INFO(optimizer);
    Fixture f;
    f.objective = std::make_shared<InfGradientObjective>(2);
    auto t = spec(4, 1, {4, TimeUnit::step});
    t.clip_grad_value = 0.5;
    auto trainer = f.trainer(t, std::make_shared<Data>(16), false, optimizer);
    auto summary = trainer->fit();
    CHECK(summary.counters.skipped_iterations == 1);
    REQUIRE(f.recorder->results.size() == 4);
    CHECK(f.recorder->results[2].skipped.item<bool>());
    CHECK_FALSE(f.recorder->results[1].skipped.item<bool>());
    CHECK(std::isinf(f.recorder->results[2].grad_norm_before.item<double>()));
    CHECK(torch::isfinite(f.net->fc->weight).all().item<bool>());
  }
}

TEST_CASE("zero_grad(set_to_none = false) zeroes the same gradient buffers in place") {
  auto w = torch::randn({3, 2}).requires_grad_(true), b = torch::randn({3}).requires_grad_(true);
  Optimizer opt(OptimizerSpec{}, {ParameterGroup{"g", {w, b}, 1e-2, 0.0, 1e-8, {0.9, 0.999}}});
  (w.sum() * 2 + b.sum()).backward();
  const void* w_buffer = w.grad().data_ptr();
  opt.zero_grad(false);
  REQUIRE(w.grad().defined());
  CHECK(w.grad().data_ptr() == w_buffer);
  CHECK(w.grad().abs().sum().item<float>() == 0.0f);
  CHECK(b.grad().abs().sum().item<float>() == 0.0f);
  opt.zero_grad();
  CHECK_FALSE(w.grad().defined());
}

namespace {
class CountersAtUpdate : public Callback {
 public:
  std::vector<std::int64_t> before, after;
  void on_before_optimizer_step(const TrainState& s, TrainerControl&) override { before.push_back(s.counters.step); }
  void on_optimizer_step_end(const TrainState& s, const StepResult&, TrainerControl&) override {
    after.push_back(s.counters.step);
  }
};
}  // namespace

TEST_CASE("the update's hooks see the window's last micro-batch counted") {
  Fixture f;
  auto seen = std::make_shared<CountersAtUpdate>();
  f.first.push_back(seen);
  f.trainer(spec(4, 2, {4, TimeUnit::step}), std::make_shared<Data>(16), false, "adamw")->fit();
  CHECK(seen->before == std::vector<std::int64_t>{2, 4});
  CHECK(seen->after == std::vector<std::int64_t>{2, 4});
}

namespace {

/// Data(n) without samples [from, from + count): the same batches less the ones that start there.
class Without : public LabelledDataset {
 public:
  Without(std::int64_t n, std::int64_t from, std::int64_t count) : data_(n), from_(from), count_(count) {}
  std::int64_t size() const override { return data_.size() - count_; }
  Example get(std::int64_t i) const override { return data_.get(i < from_ ? i : i + count_); }

 private:
  Data data_;
  std::int64_t from_, count_;
};

/// The first group's learning rate of each update, rounded to 1e-12 (0.1 * 0.75 is not 0.075).
std::vector<double> window_lrs(const Recorder& r) {
  std::vector<double> out;
  for (const auto& x : r.results)
    if (x.window_complete) out.push_back(std::round(x.learning_rates.at(0) * 1e12) / 1e12);
  return out;
}

}  // namespace

TEST_CASE("the schedule counts applied updates: a skipped window holds it (schedule_counts)") {
  // Warm-up over 4 updates (factors 0, 1/4, 2/4, 3/4), lr 0.1. Run A: 4 windows, the second
  // (samples 4..7) holds a NaN and is skipped. Run B: the same batches without that window. By
  // default the schedule counts applied updates, so A's updates run at the factors of B's:
  // 0, (skipped), 1/4, 2/4, and A ends with B's weights. Counting iterations, A's third and
  // fourth updates run at 2/4 and 3/4.
  SchedulerSpec warmup;
  warmup.warmup = 4;
  for (const char* optimizer : {"sgd", "adamw"}) {  // skips decided on the host / on the device (fused)
    INFO(optimizer);
    auto t = spec(4, 1, {4, TimeUnit::step});
    t.log_every = 1;  // the loop reads the device's skip count every step: reported lrs are exact
    Fixture a, b;
    {
      torch::NoGradGuard ng;
      b.net->fc->weight.copy_(a.net->fc->weight);
      b.net->fc->bias.copy_(a.net->fc->bias);
    }
    a.schedule = b.schedule = warmup;
    CHECK(a.trainer(t, std::make_shared<Data>(16, 5), false, optimizer)->fit().counters.skipped_iterations == 1);
    b.trainer(spec(4, 1, {3, TimeUnit::step}), std::make_shared<Without>(16, 4, 4), false, optimizer)->fit();
    CHECK(torch::equal(a.net->fc->weight, b.net->fc->weight));
    CHECK(torch::equal(a.net->fc->bias, b.net->fc->bias));
    CHECK(window_lrs(*a.recorder) == std::vector<double>{0.0, 0.025, 0.025, 0.05});
    CHECK(window_lrs(*b.recorder) == std::vector<double>{0.0, 0.025, 0.05});

    Fixture c;
    {
      torch::NoGradGuard ng;
      c.net->fc->weight.copy_(b.net->fc->weight);  // any start: only the schedule is compared
    }
    c.schedule = warmup;
    t.schedule_counts = ScheduleCounts::iterations;
    c.trainer(t, std::make_shared<Data>(16, 5), false, optimizer)->fit();
    CHECK(window_lrs(*c.recorder) == std::vector<double>{0.0, 0.025, 0.05, 0.075});
  }
}

TEST_CASE("the schedule's checkpoint state names what it counts") {
  auto w = torch::zeros({2}).requires_grad_(true);
  Optimizer opt(OptimizerSpec{}, {ParameterGroup{"g", {w}, 0.1, 0.0, 1e-8, {0.9, 0.999}}});
  SchedulerSpec warmup;
  warmup.warmup = 10;
  Counters c;
  c.iteration = 7;
  c.skipped_iterations = 3;
  LrSchedule applied(warmup, ScheduleCounts::applied_updates, 100, opt, c);
  LrSchedule iterations(warmup, ScheduleCounts::iterations, 100, opt, c);
  const StateDict a = applied.state_dict(), i = iterations.state_dict();
  REQUIRE(a.size() == 1);
  CHECK(a.at("applied_updates").item<std::int64_t>() == 4);
  REQUIRE(i.size() == 1);
  CHECK(i.at("iterations").item<std::int64_t>() == 7);
  // Restored: the checkpoint's position in the same unit; another unit's falls back on the counters.
  Counters fresh;
  LrSchedule resumed(warmup, ScheduleCounts::applied_updates, 100, opt, fresh);
  resumed.load_state_dict(a);
  resumed.start();
  CHECK(opt.lr(0) == Approx(0.04));
  LrSchedule switched(warmup, ScheduleCounts::applied_updates, 100, opt, c);
  switched.load_state_dict(i);
  switched.start();
  CHECK(opt.lr(0) == Approx(0.04));
  CHECK_THROWS_WITH(switched.load_state_dict({{"steps", torch::tensor(1)}}), Catch::Contains("applied_updates"));
}

}  // namespace refit_test_trainer
