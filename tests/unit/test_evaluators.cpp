// The built-in evaluators: "knn" reproduces DINO's weighted k-NN classifier (predictions and
// accuracy from tests/golden/make_knn.py, Python PyTorch); "linear_probe" learns a linearly
// separable problem, the same number twice, under the loop's no_grad and autocast; config
// errors carry JSON pointers.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "evaluators/evaluators.h"
#include "io/safetensors.h"
#include "precision/autocast_guard.h"
#include "data_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_evaluators {

using namespace refit;
using namespace refit::test;

namespace {

class Identity : public TensorModel {
 public:
  torch::Tensor forward(const torch::Tensor& x) override { return x; }
};

class Scale : public TensorModel {
 public:
  explicit Scale(double s) : s_(s) {}
  torch::Tensor forward(const torch::Tensor& x) override { return x * s_; }

 private:
  double s_;
};

/// A labelled set over fixed tensors, in batches of `batch_size` (the last one partial).
class TensorData : public EvalData {
 public:
  TensorData(torch::Tensor x, torch::Tensor y, std::int64_t batch_size, std::int64_t classes = -1)
      : x_(std::move(x)), y_(std::move(y)), batch_size_(batch_size), classes_(classes) {}
  std::int64_t batches() const override { return (size() + batch_size_ - 1) / batch_size_; }
  Batch batch(std::int64_t i) const override {
    const std::int64_t start = i * batch_size_, len = std::min(batch_size_, size() - start);
    return labelled_batch(x_.narrow(0, start, len), y_.narrow(0, start, len));
  }
  std::int64_t size() const override { return x_.size(0); }
  std::int64_t num_classes() const override { return classes_; }
  std::vector<FieldInfo> fields() const override { return {{"features"}, {"labels"}}; }

 private:
  torch::Tensor x_, y_;
  std::int64_t batch_size_, classes_;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    register_builtin_evaluators(*reg);
    return reg;
  }();
  return *r;
}

std::vector<ConfigIssue> parse_issues(const std::string& type, const Json& config) {
  auto issues = std::make_shared<ConfigIssues>();
  registry().evaluators.parse(type, "/evaluators/0/type", ConfigReader(config, "/evaluators/0/config", issues));
  return issues->list();
}

EvaluatorPtr build(const std::string& type, const Json& config) {
  auto issues = std::make_shared<ConfigIssues>();
  auto builder = registry().evaluators.parse(type, "/type", ConfigReader(config, "/config", issues));
  issues->throw_if_any();
  REQUIRE(builder);
  return builder(BuildContext{});
}

io::SafetensorsFile golden() { return io::SafetensorsFile::open(test::source_dir() + "/tests/golden/knn/knn.safetensors"); }

ModelMap identity_models() { return {{"id", std::make_shared<Identity>()}, {"half", std::make_shared<Scale>(0.5)}}; }

}  // namespace

TEST_CASE("knn: DINO's weighted k-NN vote matches Python's predictions", "[evaluators]") {
  auto g = golden();
  REQUIRE(g.metadata().at("k") == "10");
  auto bank = g.load("bank_features"), labels = g.load("bank_labels"), queries = g.load("query_features");
  auto expected = g.load("predictions");
  for (std::int64_t chunk : {0, 1, 7, 60}) {
    INFO("chunk " << chunk);
    auto predicted = knn_predict(bank, labels, queries, 10, 0.07, 5, chunk);
    REQUIRE(predicted.sizes() == expected.sizes());
    CHECK(predicted.equal(expected));
  }
  // Classes no bank sample has get no votes: the same predictions.
  CHECK(knn_predict(bank, labels, queries, 10, 0.07, 8).equal(expected));
}

TEST_CASE("knn: the evaluator's accuracy matches Python's, through a model chain", "[evaluators]") {
  auto g = golden();
  const double expected = g.load("accuracy").item<double>();
  REQUIRE(expected > 0.5);
  REQUIRE(expected < 1.0);
  // Inputs [N, 2, 4]: the features are flattened to [N, 8]; the chain's scale does not change
  // cosine similarities.
  TensorData bank(g.load("bank_features").view({-1, 2, 4}), g.load("bank_labels"), 32);
  TensorData queries(g.load("query_features").view({-1, 2, 4}), g.load("query_labels"), 25);
  TrainState state;
  EvaluatorContext context{state, torch::kCPU, 0, {{"ref", &bank}, {"q", &queries}}};

  auto knn = build("knn", {{"models", {"id", "half"}},
                           {"bank", "ref"},
                           {"queries", "q"},
                           {"k", 10},
                           {"temperature", 0.07},
                           {"metric", "knn_top1"}});
  CHECK(knn->required_models() == std::vector<std::string>{"id", "half"});
  CHECK(knn->required_data() == std::vector<std::string>{"ref", "q"});
  auto metrics = knn->evaluate(identity_models(), context);
  REQUIRE(metrics.size() == 1);
  CHECK(metrics.at("knn_top1") == Approx(expected).epsilon(1e-12));

  // The defaults (k 20, metric "knn_accuracy"), under the loop's no_grad and bf16 autocast.
  {
    torch::NoGradGuard no_grad;
    AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16, true);
    auto knn20 = build("knn", {{"models", {"id"}}, {"bank", "ref"}, {"queries", "q"}});
    auto m = knn20->evaluate(identity_models(), context);
    REQUIRE(m.count("knn_accuracy"));
    auto bank_x = g.load("bank_features"), query_x = g.load("query_features");
    double reference = knn_predict(bank_x, g.load("bank_labels"), query_x, 20, 0.07, 5)
                           .eq(g.load("query_labels"))
                           .to(torch::kDouble)
                           .mean()
                           .item<double>();
    CHECK(m.at("knn_accuracy") == Approx(reference).epsilon(1e-12));
  }

  // Evaluation-time errors name the problem.
  CHECK_THROWS_WITH(
      build("knn", {{"models", {"id"}}, {"bank", "q"}, {"queries", "q"}, {"k", 100}})->evaluate(identity_models(), context),
      Catch::Contains("k = 100") && Catch::Contains("has only 60 samples"));
  CHECK_THROWS_WITH(
      build("knn", {{"models", {"id"}}, {"bank", "nope"}, {"queries", "q"}})->evaluate(identity_models(), context),
      Catch::Contains("data set \"nope\""));
  CHECK_THROWS_WITH(
      build("knn", {{"models", {"backbone"}}, {"bank", "ref"}, {"queries", "q"}})->evaluate(identity_models(), context),
      Catch::Contains("no model named \"backbone\""));
  TensorData too_few_classes(g.load("bank_features"), g.load("bank_labels"), 64, /*classes=*/3);
  EvaluatorContext declared{state, torch::kCPU, 0, {{"ref", &too_few_classes}, {"q", &queries}}};
  CHECK_THROWS_WITH(
      build("knn", {{"models", {"id"}}, {"bank", "ref"}, {"queries", "q"}})->evaluate(identity_models(), declared),
      Catch::Contains("has label 4 but declares 3 classes"));
}

namespace {

/// A linearly separable problem: 3 classes by the argmax of a random linear map, points within
/// a margin of a decision boundary dropped.
std::pair<torch::Tensor, torch::Tensor> separable(std::int64_t n, std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto w_gen = at::make_generator<at::CPUGeneratorImpl>(99);
  torch::Tensor w = torch::randn({10, 3}, w_gen, torch::kFloat);
  torch::Tensor x = torch::randn({4 * n, 10}, gen, torch::kFloat);
  auto top = (x.mm(w)).topk(2, 1);
  torch::Tensor scores = std::get<0>(top), keep = (scores.select(1, 0) - scores.select(1, 1)).gt(0.5);
  torch::Tensor xs = x.index({keep}).narrow(0, 0, n), ys = std::get<1>(top).select(1, 0).index({keep}).narrow(0, 0, n);
  return {xs.contiguous(), ys.contiguous()};
}

}  // namespace

TEST_CASE("linear_probe: learns a linearly separable problem, deterministically", "[evaluators]") {
  auto [bx, by] = separable(600, 1);
  auto [qx, qy] = separable(300, 2);
  TensorData bank(bx, by, 128), queries(qx, qy, 128);
  TrainState state;
  EvaluatorContext context{state, torch::kCPU, 1234, {{"train", &bank}, {"val", &queries}}};
  auto probe = build("linear_probe", {{"models", {"id"}}, {"bank", "train"}, {"queries", "val"}, {"batch_size", 64}});
  CHECK(probe->required_data() == std::vector<std::string>{"train", "val"});

  auto run = [&](const EvaluatorContext& ctx) {
    // As the loop calls it: no gradients, autocast on.
    torch::NoGradGuard no_grad;
    AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16, true);
    auto m = probe->evaluate(identity_models(), ctx);
    REQUIRE(m.size() == 1);
    CHECK(!torch::GradMode::is_enabled());
    CHECK(at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
    return m.at("linear_probe_accuracy");
  };
  const double first = run(context), second = run(context);
  INFO("accuracy " << first);
  CHECK(first > 0.95);
  CHECK(first == second);
  EvaluatorContext other_seed{state, torch::kCPU, 7, context.data};
  CHECK(run(other_seed) > 0.95);

  // normalize, weight decay, a named metric.
  auto normalized = build("linear_probe", {{"models", {"id"}},
                                           {"bank", "train"},
                                           {"queries", "val"},
                                           {"epochs", 50},
                                           {"lr", 0.05},
                                           {"weight_decay", 1e-4},
                                           {"normalize", true},
                                           {"metric", "probe"}});
  auto m = normalized->evaluate(identity_models(), context);
  CHECK(m.at("probe") > 0.9);
}

TEST_CASE("evaluators: config errors carry JSON pointers", "[evaluators]") {
  using test::message_at;
  const Json knn = {{"models", {"backbone"}}, {"bank", "train"}, {"queries", "val"}};
  CHECK(parse_issues("knn", knn).empty());

  auto with = [](Json j, const std::string& key, Json value) {
    j[key] = std::move(value);
    return j;
  };
  CHECK_THAT(message_at(parse_issues("knn", with(knn, "k", 0)), "/evaluators/0/config/k"),
             Catch::Contains("expected a value in [1,") && Catch::Contains("got 0"));
  CHECK_THAT(message_at(parse_issues("knn", with(knn, "k", "20")), "/evaluators/0/config/k"),
             Catch::Contains("expected an integer"));
  CHECK_THAT(message_at(parse_issues("knn", with(knn, "temperature", 0)), "/evaluators/0/config/temperature"),
             Catch::Contains("expected a positive number"));
  CHECK_THAT(message_at(parse_issues("knn", with(knn, "kk", 10)), "/evaluators/0/config/kk"),
             Catch::Contains("unknown key") && Catch::Contains("did you mean \"k\"?"));
  CHECK(message_at(parse_issues("knn", {{"models", {"backbone"}}, {"queries", "val"}}), "/evaluators/0/config/bank") ==
        "missing required key");
  CHECK_THAT(message_at(parse_issues("knn", with(knn, "models", Json::array())), "/evaluators/0/config/models"),
             Catch::Contains("at least one model"));
  CHECK_THAT(message_at(parse_issues("knn", with(knn, "bank", "")), "/evaluators/0/config/bank"),
             Catch::Contains("/data/sets"));
  // Every problem at once.
  auto all = parse_issues("knn", {{"models", "backbone"}, {"k", -1}, {"metric", ""}});
  CHECK(all.size() == 5);
  CHECK_THAT(message_at(all, "/evaluators/0/config/models"), Catch::Contains("expected an array of strings"));
  CHECK(message_at(all, "/evaluators/0/config/queries") == "missing required key");
  CHECK_THAT(message_at(all, "/evaluators/0/config/metric"), Catch::Contains("non-empty"));

  const Json probe = {{"models", {"backbone"}}, {"bank", "train"}, {"queries", "val"}};
  CHECK(parse_issues("linear_probe", probe).empty());
  CHECK_THAT(message_at(parse_issues("linear_probe", with(probe, "epochs", 0)), "/evaluators/0/config/epochs"),
             Catch::Contains("expected a value in [1,"));
  CHECK_THAT(message_at(parse_issues("linear_probe", with(probe, "batch_size", 0)), "/evaluators/0/config/batch_size"),
             Catch::Contains("expected a value in [1,"));
  CHECK_THAT(message_at(parse_issues("linear_probe", with(probe, "lr", -1)), "/evaluators/0/config/lr"),
             Catch::Contains("expected a value in [0"));
  CHECK_THAT(message_at(parse_issues("linear_probe", with(probe, "normalise", true)), "/evaluators/0/config/normalise"),
             Catch::Contains("did you mean \"normalize\"?"));
  CHECK_THAT(message_at(parse_issues("linear_probe", with(probe, "normalize", 1)), "/evaluators/0/config/normalize"),
             Catch::Contains("expected a boolean"));
  CHECK(message_at(parse_issues("linear_probe", {{"models", {"backbone"}}, {"bank", "train"}}),
                   "/evaluators/0/config/queries") == "missing required key");
  CHECK_THAT(message_at(parse_issues("knn_probe", probe), "/evaluators/0/type"),
             Catch::Contains("unknown evaluator type \"knn_probe\""));
}

}  // namespace refit_test_evaluators
