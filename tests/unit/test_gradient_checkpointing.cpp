// Gradient checkpointing (/models/<i>/gradient_checkpointing, include/refit/recompute.h): one
// training step's loss and every trainable gradient, by name, with and without recomputation in
// the backward, on the quickstart (LoRA in a frozen bf16 ViT under bf16 autocast, LoRA dropout on)
// and on all-MiniLM-L6-v2 (LoRA in a frozen bf16 BERT, its hidden and attention dropout on). The
// recomputation runs the same kernels on the same inputs with the forward's random numbers, so
// the gradients are equal bit for bit; LoRA factors inside the checkpointed frozen blocks get
// theirs although no block input requires a gradient.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include "core/recipe_parser.h"
#include "data/loader.h"
#include "precision/autocast_guard.h"
#include "precision/mode.h"
#include "run/assembly.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_gradient_checkpointing {

namespace fs = std::filesystem;
using namespace refit;

namespace {

struct Step {
  double loss = 0;
  int recomputed_blocks = 0;                       // nodes of refit::detail::RecomputedBlock in the loss's graph
  std::map<std::string, torch::Tensor> gradients;  // "<model>/<parameter>"
  torch::Tensor rng_after;                         // the CPU generator's state after the backward
};

/// One forward and backward of the recipe's objective on its first training batch, in training
/// mode, from one seed.
Step one_step(const fs::path& recipe, std::vector<std::string> overrides, std::int64_t batch_size) {
  overrides.push_back("output.dir=" + (fs::temp_directory_path() / "refit-tests" / "recompute").string());
  Assembly assembly(load_recipe(recipe, overrides));
  auto registry = assembly.build_models();
  for (auto& m : registry->models()) m.model->train(true);
  {
    // LoRA's B starts at zero, which makes A's gradient zero: a nonzero B makes every gradient informative.
    torch::NoGradGuard no_grad;
    torch::manual_seed(3);
    for (auto& m : registry->models())
      for (auto& p : m.parameters)
        if (p.path.find("lora_B") != std::string::npos) p.tensor.normal_(0.0, 0.05);
  }
  const ModelMap models = registry->model_map();
  DataLoader loader(assembly.train_data(), LoaderOptions{batch_size, false, false, 0});
  const Batch batch = loader.batch(0, 0);
  TrainState state;
  torch::manual_seed(11);
  LossOutput out;
  {
    const Precision p = assembly.precision();
    AutocastGuard autocast(torch::kCPU, autocast_dtype(p), uses_autocast(p));
    out = assembly.objective()->compute(models, batch, ObjectiveContext{state, true});
  }
  Step s;
  // The graph shows the recomputation really happens: one node per checkpointed block.
  std::set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{out.loss_sum.grad_fn().get()};
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (n->name().find("RecomputedBlock") != std::string::npos) ++s.recomputed_blocks;
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
  out.loss_sum.backward();
  s.loss = out.loss_sum.item<double>();
  for (const auto& m : registry->models())
    for (const auto& p : m.parameters)
      if (p.trainable) s.gradients[m.spec.name + "/" + p.path] = p.tensor.grad();
  s.rng_after = at::detail::getDefaultCPUGenerator().get_state();
  return s;
}

void check_equal(const Step& plain, const Step& recomputed, std::size_t expected_lora) {
  CHECK(recomputed.loss == plain.loss);
  REQUIRE(recomputed.gradients.size() == plain.gradients.size());
  std::size_t lora = 0;
  for (const auto& [name, g] : plain.gradients) {
    INFO(name);
    const torch::Tensor& r = recomputed.gradients.at(name);
    REQUIRE(g.defined());
    REQUIRE(r.defined());  // every trainable parameter got a gradient, LoRA inside the frozen blocks too
    CHECK(torch::equal(g, r));
    if (name.find("lora_") != std::string::npos) {
      ++lora;
      CHECK(g.abs().sum().item<double>() > 0);
    }
  }
  CHECK(lora == expected_lora);
  // The backward's recomputation put the generator back: the training's stream goes on as without it.
  CHECK(torch::equal(recomputed.rng_after, plain.rng_after));
}

}  // namespace

TEST_CASE("gradient checkpointing: the quickstart's loss and LoRA gradients are equal bit for bit, LoRA dropout on") {
  const fs::path recipe = fs::path(test::source_dir()) / "recipes/quickstart.json";
  const std::vector<std::string> base{"models.0.adapters.0.config.dropout=0.1"};
  std::vector<std::string> recompute = base;
  recompute.push_back("models.0.gradient_checkpointing=true");
  const Step plain = one_step(recipe, base, 16);
  const Step recomputed = one_step(recipe, recompute, 16);
  CHECK(plain.recomputed_blocks == 0);
  CHECK(recomputed.recomputed_blocks == 4);
  check_equal(plain, recomputed, /*4 layers x 5 targets x A, B*/ 40);
  // Only some blocks: a regex over the block paths.
  std::vector<std::string> some = base;
  some.push_back("models.0.gradient_checkpointing=\"encoder\\\\.layer\\\\.[13]\"");
  const Step two = one_step(recipe, some, 16);
  CHECK(two.recomputed_blocks == 2);
  check_equal(plain, two, 40);
}

TEST_CASE("gradient checkpointing: MiniLM's loss and LoRA gradients are equal bit for bit, its dropout on") {
  const fs::path recipe = fs::path(test::source_dir()) / "recipes/text/minilm-lora-bf16.json";
  const std::vector<std::string> base{"data.train.config.max_length=32"};
  std::vector<std::string> recompute = base;
  recompute.push_back("models.0.gradient_checkpointing=true");
  const Step plain = one_step(recipe, base, 8);
  const Step recomputed = one_step(recipe, recompute, 8);
  CHECK(recomputed.recomputed_blocks == 6);
  check_equal(plain, recomputed, /*6 layers x 6 targets x A, B*/ 72);
}

TEST_CASE("gradient checkpointing: an MLP's hidden layers (dropout 0.3), all trainable, bit for bit") {
  const fs::path dir = fs::temp_directory_path() / "refit-tests" / "recompute-mlp";
  fs::create_directories(dir);
  const nlohmann::json recipe{
      {"plugins", {{"load", {"vision", "datasets"}}}},
      {"models",
       {{{"name", "net"},
         {"type", "mlp"},
         {"config", {{"in_features", 8}, {"hidden", {32, 32}}, {"out_features", 3}, {"dropout", 0.3}}},
         {"trainable", true}}}},
      {"data",
       {{"train", {{"type", "synthetic"}, {"config", {{"num_samples", 64}, {"num_features", 8}, {"num_classes", 3}}}}}}},
      {"objective", {{"type", "classification"}, {"config", {{"models", {"net"}}}}}},
      {"training", {{"duration", "1:step"}, {"precision", "fp32"}}}};
  std::ofstream(dir / "mlp.json") << recipe.dump();
  const Step plain = one_step(dir / "mlp.json", {}, 16);
  const Step recomputed = one_step(dir / "mlp.json", {"models.0.gradient_checkpointing=true"}, 16);
  CHECK(recomputed.recomputed_blocks == 2);
  check_equal(plain, recomputed, 0);
}

TEST_CASE("gradient checkpointing: a model without blocks, a regex matching none and a bad value are errors") {
  const fs::path recipe = fs::path(test::source_dir()) / "recipes/quickstart.json";
  auto build = [&](const std::string& setting) {
    Assembly assembly(load_recipe(recipe, {setting}));
    assembly.build_models();
  };
  CHECK_THROWS_WITH(build("models.1.gradient_checkpointing=true"),
                    Catch::Contains("/models/1/gradient_checkpointing: model type \"linear_head\" lists no blocks"));
  CHECK_THROWS_WITH(build("models.0.gradient_checkpointing=\"blocks\\\\.0\""),
                    Catch::Contains("matches none of the model's blocks (encoder.layer.0 ... encoder.layer.3)"));
  CHECK_THROWS_WITH(build("models.0.gradient_checkpointing=3"), Catch::Contains("expected true, false or a regex"));
  build("models.0.gradient_checkpointing=false");
}

}  // namespace refit_test_gradient_checkpointing
