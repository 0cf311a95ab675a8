// The dino plugin and EMA models against the reference Python (tests/golden/make_dino.py: DINO's
// own DINOLoss, DINOHead and cosine_scheduler): loss, gradients, centre update, teacher
// temperature warm-up, head forward and the EMA update with a skipped step; EMA registration
// rules; a DINO run resumed from a checkpoint inside an accumulation window ends bit-identical.
#include <cmath>
#include <functional>
#include <iostream>

#include <ATen/ATen.h>

#include "callbacks/ema.h"
#include "core/plugin_loader.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "model/model_registry.h"
#include "model/weights.h"
#include "refit/layers.h"
#include "cli/commands/export.h"
#include "core/recipe_parser.h"
#include "run/assembly.h"
#include "run_support.h"
#include "data_support.h"
#include "replaying_step_graph.h"
#include "numeric_bounds.h"
#include "test_support.h"
#include "train/checkpoint.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_dino {

using namespace refit;
using namespace refit::test;
namespace fs = std::filesystem;

namespace {

io::SafetensorsFile golden() {
  return io::SafetensorsFile::open(fs::path(test::source_dir()) / "tests/golden/dino/dino.safetensors");
}

double max_abs(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

/// A batch of `n` views made by `view(v)`, the first `globals` global crops, and zero labels.
template <class F>
Batch crops_batch(F&& view, int n, int globals) {
  Batch b;
  for (int v = 0; v < n; ++v)
    b.set(v < globals ? "global_crop." + std::to_string(v) : "local_crop." + std::to_string(v - globals), view(v));
  b.samples = b.at("global_crop.0").size(0);
  b.set("labels", torch::zeros({b.samples}, torch::kLong));
  return b;
}

class Identity : public TensorModel {
 public:
  torch::Tensor forward(const torch::Tensor& x) override { return x; }
};

class Shift : public TensorModel {
 public:
  explicit Shift(torch::Tensor s) : shift(std::move(s)) {}
  torch::Tensor forward(const torch::Tensor& x) override { return x + shift; }
  torch::Tensor shift;
};

class Net : public TensorModel {
 public:
  Net() {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 5));
    out = register_module("out", std::make_shared<nn::Linear>(5, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return out->forward(fc->forward(x)); }
  std::shared_ptr<nn::Linear> fc, out;
};

struct DinoPlugin {
  Registry registry;
  PluginLoader loader{registry};
  DinoPlugin() { loader.load("dino"); }
  ObjectivePtr objective(Json config) {
    auto issues = std::make_shared<ConfigIssues>();
    auto build = registry.objectives.parse("dino", "/type", ConfigReader(std::move(config), "/config", issues));
    if (!issues->empty()) FAIL(ConfigError(issues->list()).what());
    return build(BuildContext{});
  }
};

}  // namespace

TEST_CASE("dino: loss, gradients, centre and teacher temperature match DINO's DINOLoss") {
  auto g = golden();
  DinoPlugin plugin;
  const Json config{{"student", {"student"}},
                    {"teacher", {"teacher"}},
                    {"global_crops", 2},
                    {"student_temperature", 0.1},
                    {"warmup_teacher_temperature", 0.04},
                    {"teacher_temperature", 0.07},
                    {"warmup_teacher_temperature_iterations", 5},
                    {"center_momentum", 0.9}};
  auto objective = plugin.objective(config);
  ModelMap models{{"student", std::make_shared<Identity>()}, {"teacher", std::make_shared<Shift>(g.load("teacher_shift"))}};
  objective->load_state_dict({{"center", g.load("center0")}});
  // The exact run: the same objective in double from the same inputs. refit's and DINO's values
  // are each within the probabilistic bound (numeric_bounds.h) of it, first order (softmax and
  // log are not polynomials) relative to the largest exact magnitude. Depths, K = 16 prototypes:
  // the teacher's softmax of (t - c) / temperature (K + 5), the student's log-softmax of s /
  // temperature (K + 5), the cross-entropy's sum over K (K) and the mean over the 6 pairs and 3
  // samples (6 + 3 + 2): n_loss = 3 K + 21; a gradient runs back through the same: 2 n_loss; the
  // centre's update sums the 6 teacher rows (6 + 1) and mixes (3): 10.
  auto exact_objective = plugin.objective(config);
  ModelMap exact_models{{"student", std::make_shared<Identity>()},
                        {"teacher", std::make_shared<Shift>(g.load("teacher_shift").to(torch::kDouble))}};
  exact_objective->load_state_dict({{"center", g.load("center0").to(torch::kDouble)}});
  const std::int64_t K = g.load("center0").size(-1), n_loss = 3 * K + 21, n_grad = 2 * n_loss, n_center = 10;
  const std::int64_t iterations[] = {2, 9};
  for (int step = 0; step < 2; ++step) {
    INFO("call " << step << " at iteration " << iterations[step]);
    const std::string s = std::to_string(step);
    TrainState state;
    state.counters.iteration = iterations[step];
    state.max_iterations = 12;
    auto run = [&](Objective& o, const ModelMap& m, c10::ScalarType dtype) {
      Batch batch =
          crops_batch([&](int v) { return g.load("view" + std::to_string(v)).to(dtype).clone().requires_grad_(true); }, 4,
                      2);
      LossOutput out = o.compute(m, batch, ObjectiveContext{state, true});
      CHECK(out.count == 3);
      auto loss = out.loss_sum / 3.0;
      loss.backward();
      const auto views = views_of(batch);
      return std::make_pair(loss.detach(), torch::cat({views[0].grad(), views[1].grad(), views[2].grad(), views[3].grad()}));
    };
    const auto [loss, grad] = run(*objective, models, torch::kFloat);
    const auto [exact_loss, exact_grad] = run(*exact_objective, exact_models, torch::kDouble);
    const double loss_bound = prob_depth_bound(n_loss, torch::kFloat) * exact_loss.abs().item<double>();
    const double grad_bound = prob_depth_bound(n_grad, torch::kFloat) * exact_grad.abs().max().item<double>();
    check_bound_ratio("loss: refit", (loss.to(torch::kDouble) - exact_loss).abs().item<double>() / loss_bound);
    check_bound_ratio("loss: DINO", (g.load("loss" + s).to(torch::kDouble) - exact_loss).abs().item<double>() / loss_bound);
    check_bound_ratio("gradient: refit", (grad.to(torch::kDouble) - exact_grad).abs().max().item<double>() / grad_bound);
    check_bound_ratio("gradient: DINO",
                      (g.load("grad" + s).to(torch::kDouble) - exact_grad).abs().max().item<double>() / grad_bound);
    // The centre moves at the update (the objective is also a Callback), not in the forward.
    CHECK(max_abs(objective->state_dict().at("center"), g.load("center" + s)) == 0);
    StepResult update;
    update.skipped = torch::tensor(false);
    TrainerControl control;
    std::dynamic_pointer_cast<Callback>(objective)->on_optimizer_step_end(state, update, control);
    std::dynamic_pointer_cast<Callback>(exact_objective)->on_optimizer_step_end(state, update, control);
    const torch::Tensor exact_center = exact_objective->state_dict().at("center");
    const double center_bound = prob_depth_bound(n_center, torch::kFloat) * exact_center.abs().max().item<double>();
    const std::string next = std::to_string(step + 1);
    check_bound_ratio("centre: refit",
                      (objective->state_dict().at("center").to(torch::kDouble) - exact_center).abs().max().item<double>() /
                          center_bound);
    check_bound_ratio("centre: DINO",
                      (g.load("center" + next).to(torch::kDouble) - exact_center).abs().max().item<double>() / center_bound);
  }
  // Evaluation (training = false) leaves the centre alone.
  auto before = objective->state_dict().at("center").clone();
  Batch batch = crops_batch([&](int v) { return g.load("view" + std::to_string(v)); }, 4, 2);
  TrainState state;
  objective->compute(models, batch, ObjectiveContext{state, false});
  CHECK(torch::equal(objective->state_dict().at("center"), before));
}

TEST_CASE("dino: a batch without multi-crop views is a clear error, bad configs name their keys") {
  DinoPlugin plugin;
  auto objective = plugin.objective({{"student", {"s"}}, {"teacher", {"t"}}});
  ModelMap models{{"s", std::make_shared<Identity>()}, {"t", std::make_shared<Identity>()}};
  Batch batch = labelled_batch(torch::randn({2, 4}), torch::zeros({2}, torch::kLong));
  TrainState state;
  CHECK_THROWS_WITH(objective->compute(models, batch, ObjectiveContext{state, true}), Catch::Contains("multi_crop"));
  // The data says how many views are global crops; a configured global_crops must agree.
  auto three = plugin.objective({{"student", {"s"}}, {"teacher", {"t"}}, {"global_crops", 3}});
  Batch crops = crops_batch([](int) { return torch::randn({2, 4}); }, 4, 2);
  CHECK_THROWS_WITH(three->compute(models, crops, ObjectiveContext{state, true}),
                    Catch::Contains("global_crops is 3 but the data's multi_crop makes 2 global crops"));
  CHECK(objective->compute(models, crops, ObjectiveContext{state, true}).count == 2);

  auto issues = std::make_shared<ConfigIssues>();
  plugin.registry.objectives.parse(
      "dino", "/type",
      ConfigReader(Json{{"student", {"s"}}, {"teacher", {"t"}}, {"teacher_temprature", 0.04}, {"center_momentum", 1.5}},
                   "/objective/config", issues));
  CHECK_THAT(test::message_at(issues->list(), "/objective/config/teacher_temprature"),
             Catch::Contains("did you mean \"teacher_temperature\""));
  CHECK_THAT(test::message_at(issues->list(), "/objective/config/center_momentum"), Catch::Contains("1.5"));
}

TEST_CASE("dino: the DINO head's forward matches DINO's DINOHead (weight-normalised prototypes)") {
  auto g = golden();
  DinoPlugin plugin;
  auto issues = std::make_shared<ConfigIssues>();
  auto build = plugin.registry.models.parse(
      "dino_head", "/type",
      ConfigReader(Json{{"in_dim", 8}, {"out_dim", 10}, {"hidden_dim", 16}, {"bottleneck_dim", 6}, {"layers", 3}}, "/config",
                   issues));
  REQUIRE(issues->empty());
  auto head = tensor_model(build(BuildContext{}));
  // DINO's names; with norm_last_layer, weight_g is a buffer (never trained), weight_v a parameter.
  std::vector<std::string> names;
  for (const auto& p : head->named_parameters()) names.push_back(p.key());
  CHECK(names == std::vector<std::string>{"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias", "mlp.4.weight",
                                          "mlp.4.bias", "last_layer.weight_v"});
  torch::NoGradGuard no_grad;
  for (auto& p : head->named_parameters()) p.value().copy_(g.load("head/" + p.key()));
  for (auto& b : head->named_buffers()) b.value().copy_(g.load("head/" + b.key()));
  // The exact forward: the head in double. First order (GELU, the normalisations): refit's and
  // DINO's outputs within gamma~_n(2^-24) max |exact|, n = the three Linears (8 + 1, 16 + 1,
  // 16 + 1), two GELUs (3 each), the bottleneck's L2 normalisation (6 + 3), the prototypes'
  // weight normalisation (6 + 3) and their product (6): 77. bf16 end to end rounds each Linear's
  // operands and result (4 x 3), each GELU and normalisation (4): n16 = 16, added in bf16.
  auto exact_head = tensor_model(build(BuildContext{}));
  for (auto& p : exact_head->named_parameters()) p.value().copy_(g.load("head/" + p.key()));
  for (auto& b : exact_head->named_buffers()) b.value().copy_(g.load("head/" + b.key()));
  exact_head->to(torch::kDouble);
  const torch::Tensor exact = exact_head->forward(g.load("head_input").to(torch::kDouble));
  const double scale = exact.abs().max().item<double>();
  const double bound = prob_depth_bound(77, torch::kFloat) * scale;
  check_bound_ratio("fp32: refit", max_abs(head->forward(g.load("head_input")).to(torch::kDouble), exact) / bound);
  check_bound_ratio("fp32: DINO", max_abs(g.load("head_output").to(torch::kDouble), exact) / bound);
  // A bf16 head (bf16-true: no autocast) runs in bf16 end to end.
  head->to(torch::kBFloat16);
  auto y = head->forward(g.load("head_input").to(torch::kBFloat16));
  CHECK(y.scalar_type() == torch::kBFloat16);
  const double bound16 = (prob_depth_bound(16, torch::kBFloat16) + prob_depth_bound(77, torch::kFloat)) * scale;
  check_bound_ratio("bf16: refit", max_abs(y.to(torch::kDouble), exact) / bound16);
}

TEST_CASE("ema: m * ema + (1 - m) * source with DINO's cosine momentum, a skipped update changes nothing") {
  auto g = golden();
  EmaSpec spec{"source", 0.996, 1.0, "cosine"};
  auto expected_m = g.load("ema_momentum");
  for (int i = 0; i < 3; ++i) CHECK(std::abs(ema_momentum(spec, i, 10) - expected_m[i].item<double>()) < 1e-15);

  // A registry with a trainable source and its EMA model; the golden tensors go into fc.weight
  // viewed as [5, 4].
  ModelRegistry registry(Precision::fp32);
  auto source = std::make_shared<Net>();
  registry.add(source, ModelSpec{"source", true}, torch::kCPU);
  auto ema_model = std::make_shared<Net>();
  registry.add_ema(ema_model, ModelSpec{"ema", false, c10::kFloat}, spec, torch::kCPU);
  {
    torch::NoGradGuard no_grad;
    ema_model->fc->weight.copy_(g.load("ema_teacher0"));
  }
  EmaCallback callback(registry);
  TrainState state;
  state.max_iterations = 10;
  TrainerControl control;
  const bool skipped[] = {false, true, false};
  for (int it = 0; it < 3; ++it) {
    {
      torch::NoGradGuard no_grad;
      source->fc->weight.copy_(g.load("ema_student" + std::to_string(it)));
    }
    StepResult r;
    r.counters.iteration = it + 1;  // on_optimizer_step_end sees the count after the update
    r.skipped = torch::tensor(skipped[it]);
    callback.on_optimizer_step_end(state, r, control);
    INFO("update " << it);
    CHECK(max_abs(ema_model->fc->weight, g.load("ema_teacher" + std::to_string(it + 1))) < 1e-7);
  }
}

TEST_CASE("ema models: frozen parameters share storage, copies are float32 and frozen, low precision is refused") {
  ModelRegistry registry(Precision::bf16_mixed);
  auto source = std::make_shared<Net>();
  ModelSpec spec{"source", false, c10::kBFloat16};
  spec.rules.push_back(ParameterRule{"out\\..*", true, c10::kFloat});
  registry.add(source, spec, torch::kCPU);

  auto refused = std::make_shared<Net>();
  CHECK_THROWS_WITH(registry.add_ema(refused, ModelSpec{"bad", false, c10::kBFloat16}, EmaSpec{"source"}, torch::kCPU),
                    Catch::Contains("Declare \"dtype\": \"float32\""));
  CHECK_THROWS_WITH(registry.add_ema(refused, ModelSpec{"bad", false}, EmaSpec{"nope"}, torch::kCPU),
                    Catch::Contains("is not registered before it"));

  auto ema = std::make_shared<Net>();
  const auto& reg = registry.add_ema(ema, ModelSpec{"ema", false, c10::kFloat}, EmaSpec{"source"}, torch::kCPU);
  for (const auto& p : reg.parameters) {
    INFO(p.path);
    CHECK_FALSE(p.tensor.requires_grad());
    CHECK_FALSE(p.trainable);
    if (p.path.rfind("fc.", 0) == 0) {  // frozen in the source: the same bf16 storage
      CHECK(p.shared);
      CHECK(p.tensor.data_ptr() == source->named_parameters()[p.path].data_ptr());
      CHECK(p.tensor.scalar_type() == c10::kBFloat16);
    } else {  // trainable in the source: an own float32 copy, equal at the start
      CHECK(p.ema_source.defined());
      CHECK(p.tensor.data_ptr() != p.ema_source.data_ptr());
      CHECK(p.tensor.scalar_type() == c10::kFloat);
      CHECK(torch::equal(p.tensor, p.ema_source));
    }
  }
  // The optimizer never sees an EMA copy.
  std::size_t in_groups = 0;
  for (const auto& group : registry.parameter_groups(OptimizerSpec{})) in_groups += group.parameters.size();
  CHECK(in_groups == 2);  // out.weight, out.bias of the source
}

namespace {

Json dino_recipe(const fs::path& out, const std::string& duration) {
  const fs::path recipes = fs::path(test::source_dir()) / "recipes" / "fashion-mnist";
  Json vit = {{"image_size", 28},  {"patch_size", 4},         {"num_channels", 1},
              {"hidden_size", 64}, {"num_hidden_layers", 4},  {"num_attention_heads", 4},
              {"mlp_ratio", 2},    {"layerscale_value", 1.0}, {"output", "cls"}};
  Json lora = {
      {"type", "lora"},
      {"config",
       {{"r", 4}, {"alpha", 8}, {"target_regex", "encoder\\.layer\\.[0-9]+\\.attention\\.attention\\.(query|value)"}}}};
  return Json{{"plugins", {{"load", {"vision", "datasets", "lora", "dino"}}}},
              {"models",
               {{{"name", "backbone"},
                 {"type", "vit"},
                 {"config", vit},
                 {"weights", (recipes / "vit-backbone.safetensors").string()},
                 {"trainable", false},
                 {"dtype", "bfloat16"},
                 {"adapters", {lora}}},
                {{"name", "head"},
                 {"type", "dino_head"},
                 {"config", {{"in_dim", 64}, {"out_dim", 128}, {"hidden_dim", 64}, {"bottleneck_dim", 32}}},
                 {"trainable", true}},
                // 0.5, not DINO's 0.99: the teacher's own LoRA delta must stand clear of bf16 rounding
                // for the merged-export check below to see whether it is there.
                {{"name", "teacher_backbone"}, {"ema", {{"of", "backbone"}, {"momentum", 0.5}}}},
                {{"name", "teacher_head"}, {"ema", {{"of", "head"}, {"momentum", 0.99}}}}}},
              {"data",
               {{"train",
                 {{"type", "fashion_mnist"},
                  {"config",
                   {{"set", "train"},
                    {"limit", 64},
                    {"transforms", {{{"type", "normalize"}, {"mean", {0.286}}, {"std", {0.353}}}}},
                    {"multi_crop",
                     {{"global_crops", 2}, {"global_size", {28, 28}}, {"local_crops", 2}, {"local_size", {12, 12}}}}}}}}}},
              {"objective",
               {{"type", "dino"},
                {"config",
                 {{"student", {"backbone", "head"}},
                  {"teacher", {"teacher_backbone", "teacher_head"}},
                  {"warmup_teacher_temperature", 0.04},
                  {"teacher_temperature", 0.06},
                  {"warmup_teacher_temperature_iterations", 3}}}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 0.001}, {"weight_decay", 0.04}}},
              {"training",
               {{"duration", duration},
                {"batch_size", 8},
                {"gradient_accumulation", 2},
                {"precision", "bf16-mixed"},
                {"clip_grad_norm", 3.0},
                {"checkpoint_every", "3:step"},
                {"seed", 3}}},
              {"output", {{"dir", out.string()}}}};
}

void run(Json doc) { test::train_quietly(std::move(doc)); }

}  // namespace

TEST_CASE("dino run: resumed inside an accumulation window == straight (student, teacher, centre, optimizer)") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "dino-resume";
  io::remove_tree(base);
  run(dino_recipe(base / "straight", "10:step"));
  Json resumed = dino_recipe(base / "resumed", "10:step");
  resumed["training"]["resume"] = (base / "straight" / "checkpoints" / "step-00000003").string();
  run(resumed);
  for (const char* file : {"trainable.safetensors", "state.safetensors"}) {
    auto a = io::SafetensorsFile::open(*latest_checkpoint(base / "straight" / "checkpoints") / file).load_all();
    auto b = io::SafetensorsFile::open(*latest_checkpoint(base / "resumed" / "checkpoints") / file).load_all();
    REQUIRE(a.size() == b.size());
    std::size_t teacher = 0, center = 0;
    for (const auto& kv : a) {
      INFO(file << ": " << kv.first);
      // The metrics log's length describes the run folder's file (this resumed run's folder
      // holds only the lines it logged itself), not the training state.
      if (kv.first.size() > 10 && kv.first.compare(kv.first.size() - 10, 10, "/log_lines") == 0) continue;
      teacher += kv.first.rfind("teacher_", 0) == 0;
      center += kv.first == "objective/center";
      CHECK(torch::equal(b.at(kv.first), kv.second));
    }
    if (std::string(file) == "trainable.safetensors") CHECK(teacher > 0);  // EMA copies are checkpointed
    else
      CHECK(center == 1);  // and so is the centre
  }
  // The teacher moved away from its start but is not the student (EMA, not a copy).
  auto w = io::SafetensorsFile::open(*latest_checkpoint(base / "straight" / "checkpoints") / "trainable.safetensors");
  auto student = w.load("head/mlp.0.weight"), teacher = w.load("teacher_head/mlp.0.weight");
  CHECK_FALSE(torch::equal(student, teacher));

  // Merged export: each backbone = the frozen base + its own LoRA delta (scaling alpha / r = 2).
  // The teacher shares the student's frozen storage; merging the student must not leak into it.
  Assembly assembly(parse_recipe(dino_recipe(base / "straight", "10:step"), "/tmp"));
  cli::export_models(assembly, std::nullopt, "merged", base / "merged");
  auto original = io::SafetensorsFile::open(fs::path(test::source_dir()) / "recipes/fashion-mnist/vit-backbone.safetensors");
  const std::string q = "encoder.layer.0.attention.attention.query";
  auto base_weight = original.load(q + ".weight").to(torch::kBFloat16).to(torch::kFloat);
  auto delta = [&](const std::string& model) {
    return 2.0 *
           at::matmul(w.load(model + "/" + q + ".lora_default.lora_B"), w.load(model + "/" + q + ".lora_default.lora_A"));
  };
  for (const char* model : {"backbone", "teacher_backbone"}) {
    INFO(model);
    const std::string other = std::string(model) == "backbone" ? "teacher_backbone" : "backbone";
    auto merged = io::SafetensorsFile::open(base / "merged" / (std::string(model) + ".safetensors")).load(q + ".weight");
    // Root-mean-square, not max: bf16 rounding of the merged weight is noise that averages out,
    // a missing or foreign delta is not.
    auto off_by = [&](const torch::Tensor& expected) {
      return (merged.to(torch::kFloat) - expected).pow(2).mean().sqrt().item<double>();
    };
    const double own = off_by(base_weight + delta(model)), none = off_by(base_weight),
                 others = off_by(base_weight + delta(other));
    INFO("rms error: own delta " << own << ", no delta " << none << ", the other model's delta " << others);
    CHECK(own < 0.5 * none);    // its delta is in (a merge that dropped it fails here: own == none)
    CHECK(own < 0.5 * others);  // and it is its own (the student's leaking into the teacher fails here)
    CHECK(own < 1e-3);          // bf16 rounding of the merged weight
  }
}

TEST_CASE("merged export: --dtype float32 keeps the whole LoRA delta of a bf16 base") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "merged-dtype";
  io::remove_tree(base);
  const Json recipe = dino_recipe(base / "run", "3:step");
  run(recipe);
  Assembly assembly(parse_recipe(recipe, "/tmp"));
  cli::export_models(assembly, std::nullopt, "merged", base / "registered");
  cli::export_models(assembly, std::nullopt, "merged", base / "float32", c10::kFloat);
  CHECK_THROWS_WITH(cli::export_models(assembly, std::nullopt, "peft", base / "peft", c10::kFloat),
                    Catch::Contains("merged exports only"));

  auto w = io::SafetensorsFile::open(*latest_checkpoint(base / "run" / "checkpoints") / "trainable.safetensors");
  auto original = io::SafetensorsFile::open(fs::path(test::source_dir()) / "recipes/fashion-mnist/vit-backbone.safetensors");
  const std::string q = "encoder.layer.0.attention.attention.query";
  // The frozen base is bf16: its exact values, widened.
  const auto base_weight = original.load(q + ".weight").to(torch::kBFloat16).to(torch::kFloat);
  const auto delta =
      2.0 * at::matmul(w.load("backbone/" + q + ".lora_default.lora_B"), w.load("backbone/" + q + ".lora_default.lora_A"));
  auto wide = io::SafetensorsFile::open(base / "float32" / "backbone.safetensors");
  auto narrow = io::SafetensorsFile::open(base / "registered" / "backbone.safetensors");
  const auto merged32 = wide.load(q + ".weight"), merged16 = narrow.load(q + ".weight");
  CHECK(merged32.scalar_type() == torch::kFloat);
  CHECK(merged16.scalar_type() == torch::kBFloat16);  // the default: the registered dtype
  const double err32 = (merged32 - (base_weight + delta)).abs().max().item<double>();
  // How much of the delta each file keeps: 1 - |merged - (base + delta)| / |delta| (RMS).
  auto kept = [&](const torch::Tensor& merged) {
    return 1.0 - (merged.to(torch::kFloat) - (base_weight + delta)).pow(2).mean().sqrt().item<double>() /
                     delta.pow(2).mean().sqrt().item<double>();
  };
  std::cout << "merged export of a bf16 base: float32 max abs error " << err32 << ", delta kept " << kept(merged32)
            << "; bfloat16 (registered) delta kept " << kept(merged16) << "\n";
  CHECK(err32 <= 1e-6);
  CHECK(kept(merged16) < 0.95);  // what --dtype float32 is for (measured: 0.84 after these 3 steps)
  // Weights without an adapter: the base's bf16 values, exactly.
  CHECK(
      torch::equal(wide.load("layernorm.weight"), original.load("layernorm.weight").to(torch::kBFloat16).to(torch::kFloat)));
}

TEST_CASE("dino recipe: problems with EMA models, evaluators and the objective's models are reported where they are") {
  Json doc = dino_recipe("/tmp/refit-tests/dino-validate", "2:step");
  doc["models"][2]["ema"]["of"] = "backbon";
  doc["models"][3]["dtype"] = "bfloat16";
  doc["models"][3]["trainable"] = true;
  doc["objective"]["config"]["teacher"][1] = "teacher_haed";
  doc["data"]["sets"] = {{"bank", {{"type", "fashion_mnist"}, {"config", {{"set", "train"}, {"limit", 50}}}}}};
  doc["evaluators"] = {
      {{"type", "knn"}, {"config", {{"models", {"teacher_backbone"}}, {"bank", "bank"}, {"queries", "querys"}}}}};
  {
    const auto issues = test::recipe_issues(doc);
    REQUIRE_FALSE(issues.empty());
    CHECK_THAT(test::message_at(issues, "/models/2/ema/of"), Catch::Contains("did you mean \"backbone\""));
    CHECK_THAT(test::message_at(issues, "/models/3/dtype"), Catch::Contains("float32"));
    CHECK_THAT(test::message_at(issues, "/models/3/trainable"), Catch::Contains("belongs on the source model"));
    CHECK_THAT(test::message_at(issues, "/objective/config/teacher/1"),
               Catch::Contains("no model named \"teacher_haed\" in /models (did you mean \"teacher_head\"?)"));
    CHECK_THAT(test::message_at(issues, "/evaluators/0/config/queries"), Catch::Contains("no data set named \"querys\""));
  }
  // Two evaluators reporting one metric name are refused before any training.
  Json twice = dino_recipe("/tmp/refit-tests/dino-validate", "2:step");
  twice["data"]["sets"] = {{"bank", {{"type", "fashion_mnist"}, {"config", {{"set", "train"}, {"limit", 50}}}}}};
  Json knn = {{"type", "knn"}, {"config", {{"models", {"backbone"}}, {"bank", "bank"}, {"queries", "bank"}, {"k", 5}}}};
  twice["evaluators"] = {knn, knn};
  CHECK_THAT(test::message_at(test::recipe_issues(twice), "/evaluators/1/config/metric"),
             Catch::Contains("metric \"knn_accuracy\" is already reported by /evaluators/0"));
}

namespace {

/// Two 6-feature "crops" per sample; sample `nan_at` carries a NaN.
class TwoViews : public Dataset {
 public:
  std::vector<FieldInfo> fields() const override { return {{"features"}, {"labels"}, {"global_crop.0"}, {"global_crop.1"}}; }
 public:
  TwoViews(std::int64_t n, std::int64_t nan_at) : n_(n), nan_at_(nan_at) {}
  std::int64_t size() const override { return n_; }
  Example get(std::int64_t i) const override {
    auto base =
        torch::tensor({std::sin(i * 1.0), std::cos(i * 0.7), std::sin(i * 0.3), 0.1 * (i % 5), 1.0, -1.0}, torch::kFloat);
    Example e{{"features", base},
              {"labels", torch::tensor(i % 3, torch::kLong)},
              {"global_crop.0", base * 0.9},
              {"global_crop.1", base.flip(0)}};
    if (i == nan_at_) e.at("global_crop.1")[2] = NAN;
    return e;
  }

 private:
  std::int64_t n_, nan_at_;
};

class Snapshot : public Callback {
 public:
  Snapshot(const ModelRegistry& r, const Objective& o) : registry(r), objective(o) {}
  void on_optimizer_step_end(const TrainState&, const StepResult&, TrainerControl&) override {
    std::vector<torch::Tensor> s;
    for (const auto& m : registry.models())
      for (const auto& p : m.parameters)
        if (p.changes_in_training()) s.push_back(p.tensor.detach().clone());
    s.push_back(objective.state_dict().at("center").clone());
    taken.push_back(s);
  }
  const ModelRegistry& registry;
  const Objective& objective;
  std::vector<std::vector<torch::Tensor>> taken;
};

}  // namespace

namespace {

class Backbone : public TensorModel {
 public:
  Backbone() { fc = register_module("fc", std::make_shared<nn::Linear>(6, 5)); }
  torch::Tensor forward(const torch::Tensor& x) override { return fc->forward(x); }
  std::shared_ptr<nn::Linear> fc;
};

struct DinoRun {
  std::vector<std::vector<torch::Tensor>> taken;  // per update: trained tensors, EMA copies, centre
  std::int64_t skipped = 0;
  std::string plan;
};

/// A small DINO run (linear backbone + DINO head, EMA teacher, two 6-feature crops, fused AdamW,
/// clipping, teacher-temperature warm-up); with `graph_warmup` > 0 in (emulated) CUDA-graph mode.
DinoRun small_dino_run(std::int64_t nan_at, std::int64_t steps, std::int64_t graph_warmup = 0, std::int64_t k = 1,
                       std::int64_t batch = 4, std::function<CallbackPtr(const ModelRegistry&)> extra = {},
                       const std::string& optimizer = "adamw") {
  torch::manual_seed(11);
  DinoPlugin plugin;
  auto issues = std::make_shared<ConfigIssues>();
  auto head_builder = plugin.registry.models.parse(
      "dino_head", "/type",
      ConfigReader(Json{{"in_dim", 5}, {"out_dim", 16}, {"hidden_dim", 8}, {"bottleneck_dim", 4}}, "/config", issues));
  REQUIRE(issues->empty());
  ModelRegistry registry(Precision::fp32);
  auto student_backbone = std::make_shared<Backbone>(), teacher_backbone = std::make_shared<Backbone>();
  auto student_head = head_builder(BuildContext{}), teacher_head = head_builder(BuildContext{});
  registry.add(student_backbone, ModelSpec{"backbone", true}, torch::kCPU);
  registry.add(student_head, ModelSpec{"head", true}, torch::kCPU);
  registry.add_ema(teacher_backbone, ModelSpec{"teacher_backbone", false}, EmaSpec{"backbone", 0.9, 1.0}, torch::kCPU);
  registry.add_ema(teacher_head, ModelSpec{"teacher_head", false}, EmaSpec{"head", 0.9, 1.0}, torch::kCPU);
  auto objective = plugin.objective({{"student", {"backbone", "head"}},
                                     {"teacher", {"teacher_backbone", "teacher_head"}},
                                     {"warmup_teacher_temperature", 0.03},
                                     {"warmup_teacher_temperature_iterations", 5}});

  TrainerParts p;
  p.models = &registry;
  p.train = std::make_shared<DataLoader>(std::make_shared<TwoViews>(24, nan_at), LoaderOptions{batch, false, true, 0});
  p.objective = objective;
  OptimizerSpec o;  // fused AdamW: the skip is decided on the device
  o.type = optimizer;
  if (optimizer == "sgd") o.lr = 0.05, o.weight_decay = 0;
  p.optimizer = make_optimizer(o, registry.parameter_groups(o));
  auto snapshot = std::make_shared<Snapshot>(registry, *objective);
  p.callbacks = {std::make_shared<EmaCallback>(registry), snapshot};
  if (extra) p.callbacks.insert(p.callbacks.begin(), extra(registry));
  p.training.batch_size = batch;
  p.training.gradient_accumulation = k;
  p.training.duration = Duration{steps, TimeUnit::step};
  p.training.clip_grad_norm = 1.0;
  if (graph_warmup > 0) {
    p.training.cuda_graph = true;
    p.training.cuda_graph_warmup = graph_warmup;
    p.make_step_graph = replaying_step_graphs();
  }
  Trainer trainer(std::move(p));
  auto summary = trainer.fit();
  return {snapshot->taken, summary.counters.skipped_iterations, trainer.cuda_graph_plan()};
}

}  // namespace

TEST_CASE("dino: a NaN batch is skipped and counted, student, teacher and centre stay as they were") {
  auto run = small_dino_run(13, 6);
  CHECK(run.skipped == 1);
  REQUIRE(run.taken.size() == 6);
  // Sample 13 is in batch 3 (samples 12..15): that update changed nothing, the others did.
  for (std::size_t t = 0; t < run.taken[3].size(); ++t) {
    INFO("tensor " << t);
    CHECK(torch::equal(run.taken[3][t], run.taken[2][t]));
    CHECK_FALSE(torch::equal(run.taken[4][t], run.taken[3][t]));
    CHECK(torch::isfinite(run.taken[5][t]).all().item<bool>());
  }
}

namespace {

/// Makes update `at`'s gradients infinite (an fp16 overflow, say) while every output stays finite.
class InfGradientsAt : public Callback {
 public:
  InfGradientsAt(const ModelRegistry& r, int at) : registry_(r), at_(at) {}
  void on_before_optimizer_step(const TrainState&, TrainerControl&) override {
    if (updates_++ != at_) return;
    for (const auto& m : registry_.models())
      for (const auto& p : m.parameters)
        if (p.trainable && p.tensor.grad().defined()) p.tensor.grad().fill_(INFINITY);
  }

 private:
  const ModelRegistry& registry_;
  int at_, updates_ = 0;
};

}  // namespace

TEST_CASE("dino: the centre moves once per window, as one k-times-larger batch, and not on a skipped update") {
  // 24 samples: 6 updates of one batch of 8 == 6 windows of two batches of 4 (no shuffle). Per
  // update: student, head, EMA teacher and centre agree (to float32 summation order; SGD, whose
  // update is linear in the gradient: Adam's g / sqrt(v) could magnify rounding where g ~ 0).
  auto big = small_dino_run(-1, 6, 0, 1, 8, {}, "sgd");
  auto accumulated = small_dino_run(-1, 12, 0, 2, 4, {}, "sgd");
  REQUIRE(big.taken.size() == 6);
  REQUIRE(accumulated.taken.size() == 6);
  for (std::size_t u = 0; u < 6; ++u)
    for (std::size_t t = 0; t < big.taken[u].size(); ++t) {
      INFO("update " << u << ", tensor " << t << (t + 1 == big.taken[u].size() ? " (the centre)" : ""));
      CHECK(torch::allclose(accumulated.taken[u][t], big.taken[u][t], 1e-5, 1e-6));
    }
  CHECK_FALSE(torch::equal(big.taken[1].back(), big.taken[0].back()));  // the centre does move

  // Update 2's gradients are infinite, its outputs finite: the update is skipped and the centre
  // stays (it moved at every other update).
  auto skipped =
      small_dino_run(-1, 6, 0, 1, 4, [](const ModelRegistry& r) { return std::make_shared<InfGradientsAt>(r, 2); });
  CHECK(skipped.skipped == 1);
  REQUIRE(skipped.taken.size() == 6);
  CHECK(torch::equal(skipped.taken[2].back(), skipped.taken[1].back()));
  CHECK_FALSE(torch::equal(skipped.taken[3].back(), skipped.taken[2].back()));
  CHECK_FALSE(torch::equal(skipped.taken[1].back(), skipped.taken[0].back()));
}

TEST_CASE("dino in graph mode (emulated graphs): replayed steps == eager steps, temperature warm-up and centre included") {
  // Emulation re-runs the step's host code, so it checks the loop around DINO (prepare_step, the
  // windows, the EMA after replays), not that the captured kernels update the centre in place:
  // tests/gpu/test_gpu.cpp runs the DINO recipe with real graphs.
  for (std::int64_t k : {1, 2}) {
    INFO("k " << k);
    auto eager = small_dino_run(13, 12, 1000, k);  // graph mode, the warm-up outlasts the run
    auto graphed = small_dino_run(13, 12, 2, k);
    CHECK(eager.plan == "on");
    CHECK(graphed.plan == (k == 1 ? "on: step 2 captured; 9 replays, 2 eager steps"
                                  : "on: step 2 and 3 captured; 8 replays, 2 eager steps"));
    CHECK(graphed.skipped == 2);  // sample 13 is in steps 3 and 9, both after the capture
    REQUIRE(graphed.taken.size() == eager.taken.size());
    for (std::size_t u = 0; u < eager.taken.size(); ++u)
      for (std::size_t t = 0; t < eager.taken[u].size(); ++t) {
        INFO("update " << u << ", tensor " << t);
        CHECK(torch::equal(graphed.taken[u][t], eager.taken[u][t]));
      }
  }
}

TEST_CASE("validate refuses an evaluator metric that the objective already reports on the val data") {
  Json doc = dino_recipe("/tmp/refit-tests/dino-validate", "2:step");
  // A classification run with val data: "accuracy" and "loss" are the objective's.
  doc["objective"] = {{"type", "classification"}, {"config", {{"models", {"backbone"}}}}};
  doc["data"]["val"] = {{"type", "fashion_mnist"}, {"config", {{"set", "test"}, {"limit", 50}}}};
  doc["data"]["sets"] = {{"bank", {{"type", "fashion_mnist"}, {"config", {{"set", "train"}, {"limit", 50}}}}}};
  doc["evaluators"] = {
      {{"type", "knn"},
       {"config", {{"models", {"backbone"}}, {"bank", "bank"}, {"queries", "bank"}, {"k", 5}, {"metric", "accuracy"}}}}};
  CHECK_THAT(test::message_at(test::recipe_issues(doc), "/evaluators/0/config/metric"),
             Catch::Contains("metric \"accuracy\" is already reported by the objective"));
}

}  // namespace refit_test_dino
