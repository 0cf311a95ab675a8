// Named fields (SDK 4): lookups that name what is there, collation that pads variable-length
// fields and writes their masks, models with several inputs and outputs run through a chain with
// the recipe's renaming, and a padded batch whose loss is the sum of its samples' losses.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/modules/container/modulelist.h>

#include "core/plugin_loader.h"
#include "data/loader.h"
#include "run/assembly.h"
#include "data_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_fields {

using namespace refit;
using namespace refit::test;

namespace {

struct TestPlugin {
  Registry registry;
  PluginLoader loader{registry};
  TestPlugin() {
    register_builtins(registry);
    loader.load("two_input", {test_plugin_dir()});
    loader.load("ia3", {test_plugin_dir()});
  }
  template <class T>
  static std::shared_ptr<T> build(const FactoryTable<T>& table, const std::string& type, Json config) {
    auto issues = std::make_shared<ConfigIssues>();
    auto builder = table.parse(type, "/type", ConfigReader(std::move(config), "/config", issues));
    if (!issues->empty()) FAIL(ConfigError(issues->list()).what());
    return builder(BuildContext{});
  }
};

/// Every trainable gradient of `model`, cloned, then cleared.
std::vector<torch::Tensor> take_grads(Model& model) {
  std::vector<torch::Tensor> out;
  for (auto& p : model.parameters()) {
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    p.mutable_grad() = torch::Tensor();
  }
  return out;
}

}  // namespace

TEST_CASE("fields: a missing name is an error that lists the names present") {
  Fields f{{"input_ids", torch::zeros({2})}, {"labels", torch::zeros({1})}};
  CHECK(f.has("labels"));
  CHECK_FALSE(f.get("pixel_values").defined());
  CHECK_THROWS_WITH(f.at("pixel_values"), Catch::Contains("no field \"pixel_values\" (present: input_ids, labels)"));
  CHECK(numbered_fields(Fields{{"crop.0", torch::zeros({1})}, {"crop.1", torch::ones({1})}, {"crop.3", torch::ones({1})}},
                        "crop")
            .size() == 2);
}

TEST_CASE("collate: padded fields are padded to the batch's longest sample, with their mask") {
  TestPlugin plugin;
  auto data = TestPlugin::build(plugin.registry.datasets, "sequences", Json{{"n", 12}, {"max_length", 5}});
  DataLoader loader(data, LoaderOptions{6, /*shuffle=*/false, /*drop_last=*/false, 0});
  for (std::int64_t b = 0; b < 2; ++b) {
    INFO("batch " << b);
    Batch batch = loader.batch(0, b);
    REQUIRE(batch.size() == 6);
    CHECK(batch.names() == std::vector<std::string>{"attention_mask", "extra", "input_ids", "labels"});
    std::int64_t longest = 0;
    for (std::int64_t s = 0; s < 6; ++s) longest = std::max(longest, data->get(b * 6 + s).at("input_ids").size(0));
    const torch::Tensor ids = batch.at("input_ids"), mask = batch.at("attention_mask");
    CHECK(ids.sizes() == torch::IntArrayRef({6, longest}));
    CHECK(mask.sizes() == torch::IntArrayRef({6, longest}));
    CHECK(mask.scalar_type() == torch::kLong);
    for (std::int64_t s = 0; s < 6; ++s) {
      const torch::Tensor own = data->get(b * 6 + s).at("input_ids");
      const std::int64_t n = own.size(0);
      CHECK(torch::equal(ids[s].narrow(0, 0, n), own));
      CHECK(mask[s].narrow(0, 0, n).eq(1).all().item<bool>());
      if (n < longest) {
        CHECK(ids[s].narrow(0, n, longest - n).eq(0).all().item<bool>());  // the declared pad value
        CHECK(mask[s].narrow(0, n, longest - n).eq(0).all().item<bool>());
      }
    }
    CHECK(batch.at("extra").sizes() == torch::IntArrayRef({6, 2}));
  }
}

TEST_CASE("collate: a field whose length varies but is not declared padded is a clear error") {
  std::vector<Example> samples{Example{{"tokens", torch::zeros({3})}}, Example{{"tokens", torch::zeros({4})}}};
  CHECK_THROWS_WITH(collate(samples), Catch::Contains("field \"tokens\" has shape [3] in one sample and [4] in another") &&
                                          Catch::Contains("declared padded"));
  CHECK(collate(samples, {FieldInfo{"tokens", true, -1.0, "tokens_mask"}}).at("tokens").sizes() ==
        torch::IntArrayRef({2, 4}));
  std::vector<Example> different{Example{{"a", torch::zeros({1})}}, Example{{"b", torch::zeros({1})}}};
  CHECK_THROWS_WITH(collate(different), Catch::Contains("different fields (a and b)"));
}

TEST_CASE("a padded batch's loss and gradients are the sums of its samples' own (mask honoured)") {
  TestPlugin plugin;
  auto data = TestPlugin::build(plugin.registry.datasets, "sequences", Json{{"n", 10}, {"max_length", 5}});
  torch::manual_seed(3);
  ModelPtr model = TestPlugin::build(plugin.registry.models, "two_tower", Json::object());
  model->set_input_mapping({{"side", "extra"}});
  CHECK(model->main_output() == "logits");
  auto objective = TestPlugin::build(plugin.registry.objectives, "classification", Json{{"models", {"net"}}});
  ModelMap models{{"net", model}};
  CHECK(objective->required_fields(models) == std::vector<std::string>{"input_ids", "attention_mask", "extra", "labels"});
  TrainState state;

  DataLoader padded(data, LoaderOptions{10, false, false, 0});
  const Batch batch = padded.batch(0, 0);
  REQUIRE(batch.at("attention_mask").eq(0).any().item<bool>());  // some samples are padded
  LossOutput whole = objective->compute(models, batch, ObjectiveContext{state, true});
  whole.loss_sum.backward();
  const auto whole_grads = take_grads(*model);

  DataLoader single(data, LoaderOptions{1, false, false, 0});
  torch::Tensor sum = torch::zeros({});
  torch::Tensor correct = torch::zeros({});
  std::vector<torch::Tensor> grads;
  for (std::int64_t i = 0; i < 10; ++i) {
    const Batch one = single.batch(0, i);
    CHECK(one.at("attention_mask").eq(1).all().item<bool>());  // alone: no padding
    LossOutput out = objective->compute(models, one, ObjectiveContext{state, true});
    out.loss_sum.backward();
    sum = sum + out.loss_sum.detach();
    correct = correct + out.metric_sums.at("accuracy");
  }
  grads = take_grads(*model);
  CHECK(whole.count == 10);
  CHECK(std::abs(whole.loss_sum.item<double>() - sum.item<double>()) < 1e-5);
  CHECK(whole.metric_sums.at("accuracy").item<double>() == correct.item<double>());
  for (std::size_t p = 0; p < grads.size(); ++p) CHECK((whole_grads[p] - grads[p]).abs().max().item<double>() < 1e-6);

  // The second output is returned beside the main one.
  Fields out = model->run(batch);
  CHECK(out.at("embedding").sizes() == torch::IntArrayRef({10, 8}));
  // Without the mapping the model's "side" input is missing, and the error says what is there.
  model->set_input_mapping({});
  CHECK_THROWS_WITH(model->run(batch), Catch::Contains("model input \"side\" is not in the batch (fields: attention_mask, "
                                                       "extra, input_ids, labels)"));
}

TEST_CASE("a LibTorch error inside a model's forward names the model and its inputs, without a backtrace") {
  TestPlugin plugin;
  torch::manual_seed(3);
  ModelPtr model = TestPlugin::build(plugin.registry.models, "two_tower", Json::object());
  model->set_input_mapping({{"side", "extra"}});
  ModelMap models{{"net", model}};
  Batch batch{{"input_ids", torch::ones({2, 3}, torch::kLong)},
              {"attention_mask", torch::ones({2, 3}, torch::kLong)},
              {"extra", torch::zeros({2, 5})}};  // the head expects 8 + 2 features, gets 8 + 5
  batch.samples = 2;
  try {
    run_chain(models, {"net"}, batch);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("model \"net\" failed in its forward (inputs: input_ids [2, 3] Long, "
                                     "attention_mask [2, 3] Long, side [2, 5] Float)"));
    CHECK_THAT(what, !Catch::Contains("Exception raised from"));
  }
}

namespace {

/// blocks.1.mlp.fc1 is a refit::nn::Linear that expects 6 features where it gets 4.
class Block : public torch::nn::Module {
 public:
  explicit Block(std::int64_t in) { fc1 = register_module("fc1", std::make_shared<refit::nn::Linear>(in, 4)); }
  std::shared_ptr<refit::nn::Linear> fc1;
};
class Wrapper : public torch::nn::Module {
 public:
  explicit Wrapper(std::int64_t in) { mlp = register_module("mlp", std::make_shared<Block>(in)); }
  std::shared_ptr<Block> mlp;
};
class Deep : public TensorModel {
 public:
  Deep() {
    blocks = register_module("blocks", torch::nn::ModuleList());
    blocks->push_back(std::make_shared<Wrapper>(4));
    blocks->push_back(std::make_shared<Wrapper>(6));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor y = x;
    for (const auto& b : *blocks) y = b->as<Wrapper>()->mlp->fc1->forward(y);
    return y;
  }
  torch::nn::ModuleList blocks;
};

}  // namespace

TEST_CASE("a LibTorch error inside an adaptable layer names the layer's path and what it got") {
  ModelMap models{{"deep", std::make_shared<Deep>()}};
  Batch batch{{"features", torch::zeros({2, 4})}};
  batch.samples = 2;
  try {
    run_chain(models, {"deep"}, batch);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("model \"deep\" failed in its forward (inputs: features [2, 4] Float) at layer "
                                     "blocks.1.mlp.fc1 (input [2, 4] Float, weight [4, 6] Float)"));
    CHECK_THAT(what, Catch::Contains("cannot be multiplied"));
    CHECK_THAT(what, !Catch::Contains("Exception raised from"));
  }
}

}  // namespace refit_test_fields
