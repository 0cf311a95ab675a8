// A plugin built in the test tree: a model whose weights are tied to a process-wide module (to
// trigger "registered twice"), a model with BatchNorm buffers, a LoRA-style adapter, a constant
// dataset and a recording callback.
#include <algorithm>
#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>

#include "refit/plugin.h"
#include "refit/regex.h"

namespace {

using namespace refit;

/// Two linear layers; `tied` makes every instance share one process-wide first layer.
class TestNet : public TensorModel {
 public:
  TestNet(std::int64_t in, std::int64_t out, bool tied) {
    static torch::nn::Linear shared(4, 4);
    encoder = register_module("encoder", tied ? shared : torch::nn::Linear(in, in));
    head = register_module("head", torch::nn::Linear(in, out));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return head->forward(torch::relu(encoder->forward(x))); }
  torch::nn::Linear encoder{nullptr}, head{nullptr};
};

/// Linear, BatchNorm1d, ReLU, Linear: a model with buffers (running mean and variance, the
/// batch count) that training changes and a resume must restore.
class BatchNormNet : public TensorModel {
 public:
  BatchNormNet(std::int64_t in, std::int64_t hidden, std::int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    norm = register_module("norm", torch::nn::BatchNorm1d(hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    return fc2->forward(torch::relu(norm->forward(fc1->forward(x.flatten(1)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};

/// Injects LoRA-style factors (lora_A [r, in], lora_B [out, r]) into every Linear whose path
/// fully matches `target`, and declares them trainable fp32.
class TestLora : public Adapter {
 public:
  TestLora(std::string target, std::int64_t rank) : target_(std::move(target)), rank_(rank) {}
  void attach(Model& model) override {
    std::string why;
    const auto re = refit::compile_regex(target_, &why);
    if (!re) throw std::runtime_error("test_lora: target \"" + target_ + "\" is not a valid regex: " + why);
    for (auto& item : model.named_modules("", /*include_self=*/false)) {
      auto* linear = item.value()->as<torch::nn::Linear>();
      if (!linear || !refit::regex_full_match(item.key(), *re)) continue;
      auto w = linear->weight;
      item.value()->register_parameter("lora_A", torch::randn({rank_, w.size(1)}) * 0.01);
      item.value()->register_parameter("lora_B", torch::zeros({w.size(0), rank_}));
    }
  }
  std::vector<ParameterRule> parameter_rules() const override {
    ParameterRule r;
    r.pattern = ".*\\.lora_[AB]";
    r.trainable = true;
    r.dtype = c10::kFloat;
    return {r};
  }

 private:
  std::string target_;
  std::int64_t rank_;
};

class ConstantDataset : public Dataset {
 public:
  std::vector<refit::FieldInfo> fields() const override { return {{"features"}, {"labels"}}; }
 public:
  explicit ConstantDataset(std::int64_t n) : n_(n) {}
  std::int64_t size() const override { return n_; }
  Example get(std::int64_t i) const override {
    return Example{{"features", torch::full({4}, static_cast<float>(i % 3))},
                   {"labels", torch::tensor(i % 2, torch::kLong)}};
  }
  std::int64_t num_classes() const override { return 2; }

 private:
  std::int64_t n_;
};

/// Gaussian clusters whose samples listed in `poisoned` carry +inf features: a non-finite
/// gradient wherever one of them lands (in a data-parallel run, on the one rank that reads it).
class PoisonedDataset : public Dataset {
 public:
  PoisonedDataset(std::int64_t n, std::int64_t features, std::int64_t classes, std::vector<std::int64_t> poisoned)
      : n_(n), features_(features), classes_(classes), poisoned_(std::move(poisoned)) {}
  std::vector<refit::FieldInfo> fields() const override { return {{"features"}, {"labels"}}; }
  std::int64_t size() const override { return n_; }
  Example get(std::int64_t i) const override {
    const std::int64_t label = i % classes_;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(1000 + i));
    auto x = at::normal(0.0, 1.0, {features_}, gen) + static_cast<double>(label);
    if (std::find(poisoned_.begin(), poisoned_.end(), i) != poisoned_.end()) x.fill_(INFINITY);
    return Example{{"features", x}, {"labels", torch::tensor(label, torch::kLong)}};
  }
  std::int64_t num_classes() const override { return classes_; }

 private:
  std::int64_t n_, features_, classes_;
  std::vector<std::int64_t> poisoned_;
};

/// Steers the loop the only way a callback can: asks it to stop after `after` steps.
class StopAfter : public Callback {
 public:
  explicit StopAfter(std::int64_t after) : after_(after) {}
  void on_step_end(const TrainState&, const StepResult& r, TrainerControl& control) override {
    if (r.counters.step >= after_) control.request_stop();
  }

 private:
  std::int64_t after_;
};

void register_good(Registry& r) {
  r.callbacks.add("test_stop_after", "requests a stop after N steps", [](const ConfigReader& c) -> Builder<Callback> {
    auto after = c.required<std::int64_t>("steps");
    return [=](const BuildContext&) { return std::make_shared<StopAfter>(after); };
  });
  r.models.add("test_net", "two linear layers", [](const ConfigReader& c) -> Builder<Model> {
    auto in = c.optional<std::int64_t>("in", 4);
    auto out = c.optional<std::int64_t>("out", 2);
    bool tied = c.optional<bool>("tied", false);
    return [=](const BuildContext&) { return std::make_shared<TestNet>(in, out, tied); };
  });
  r.adapters.add("test_lora", "LoRA-style factors on Linear layers", [](const ConfigReader& c) -> Builder<Adapter> {
    auto target = c.required<std::string>("target");
    auto rank = c.optional<std::int64_t>("r", 2);
    return [=](const BuildContext&) { return std::make_shared<TestLora>(target, rank); };
  });
  r.models.add("test_batchnorm_net", "Linear, BatchNorm1d, ReLU, Linear (reads \"features\")",
               [](const ConfigReader& c) -> Builder<Model> {
                 auto in = c.optional<std::int64_t>("in", 4);
                 auto hidden = c.optional<std::int64_t>("hidden", 16);
                 auto out = c.optional<std::int64_t>("out", 2);
                 return [=](const BuildContext&) { return std::make_shared<BatchNormNet>(in, hidden, out); };
               });
  r.datasets.add("test_poisoned", "Gaussian clusters; the samples listed in \"poisoned\" are +inf",
                 [](const ConfigReader& c) -> Builder<Dataset> {
                   auto n = c.optional<std::int64_t>("n", 64);
                   auto features = c.optional<std::int64_t>("features", 8);
                   auto classes = c.optional<std::int64_t>("classes", 4);
                   auto poisoned = c.optional<std::vector<std::int64_t>>("poisoned", {});
                   return [=](const BuildContext&) {
                     return std::make_shared<PoisonedDataset>(n, features, classes, poisoned);
                   };
                 });
  r.datasets.add("test_constant", "n samples of 4 features", [](const ConfigReader& c) -> Builder<Dataset> {
    auto n = c.optional<std::int64_t>("n", 16);
    return [=](const BuildContext&) { return std::make_shared<ConstantDataset>(n); };
  });
}

}  // namespace

REFIT_PLUGIN("test-good", "1.2.3", register_good)
