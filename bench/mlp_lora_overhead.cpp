// Benchmark: the overhead-bound LoRA MLP step of bench/peer_mlp_lora.py (its Python peer), run
// through refit's own training loop (registry, precision engine, AdamW, clipping, StepResult).
//
// Model: 12 x [refit::nn::Linear(512, 512, no bias) frozen bf16 + LoRA r=16 (fp32, the lora
// plugin) + GELU], then a trainable fp32 Linear(512, 10). Batch 64, bf16 autocast, AdamW lr 1e-3,
// clip_grad_norm 1.0, the same batch every step (as the Python peer). Prints one JSON line.
//   mlp_lora_overhead [cpu|cuda] [steps]      (REFIT_BENCH_GRAPH=1: the step as a CUDA graph)
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "bench_support.h"
#include "core/plugin_loader.h"
#include "model/model_registry.h"
#include "objectives/classification.h"
#include "refit/layers.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace refit;

namespace {

class LoraMlp : public TensorModel {
 public:
  LoraMlp(int layers, int width) {
    for (int i = 0; i < layers; ++i)
      body_.push_back(register_module("body" + std::to_string(i), std::make_shared<nn::Linear>(width, width, false)));
    head_ = register_module("head", std::make_shared<nn::Linear>(width, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor h = x;
    for (auto& l : body_) h = at::gelu(l->forward(h));
    return head_->forward(h);
  }
  std::vector<std::shared_ptr<nn::Linear>> body_;
  std::shared_ptr<nn::Linear> head_;
};

}  // namespace

int main(int argc, char** argv) {
  const bool host_cache = bench::use_train_host_allocator();
  const std::string bf16_products = bench::configure_bf16_products();
  const std::string dev = argc > 1 ? argv[1] : "cpu";
  const std::int64_t steps = argc > 2 ? std::stoll(argv[2]) : 100, warmup = 10;
  torch::manual_seed(0);
  torch::Device device(dev == "cuda" ? torch::kCUDA : torch::kCPU);

  Registry factories;
  register_classification_objective(factories);
  PluginLoader loader(factories);
  loader.load("lora");
  auto issues = std::make_shared<ConfigIssues>();
  auto lora = factories.adapters.parse(
      "lora", "/t",
      ConfigReader(Json{{"r", 16}, {"alpha", 16}, {"target_regex", "body[0-9]+"}, {"init", "gaussian"}}, "/c", issues))(
      BuildContext{});
  auto model = std::make_shared<LoraMlp>(12, 512);
  lora->attach(*model);
  ModelSpec spec;
  spec.name = "mlp";
  spec.trainable = false;
  spec.dtype = c10::kBFloat16;
  spec.rules = lora->parameter_rules();
  ParameterRule head{"head\\..*", true, c10::kFloat, "", {}};
  spec.rules.push_back(head);
  ModelRegistry registry(Precision::bf16_mixed);
  registry.add(model, spec, device);

  TrainerParts p;
  p.models = &registry;
  p.train = std::make_shared<DataLoader>(std::make_shared<bench::FixedBatch>(torch::randn({64, 512}),
                                                                             torch::randint(0, 10, {64}, torch::kLong)),
                                         LoaderOptions{64, false, true, 0});
  p.objective = factories.objectives.parse("classification", "/t",
                                           ConfigReader(Json{{"models", {"mlp"}}}, "/c", issues))(BuildContext{});
  OptimizerSpec o;
  o.lr = 1e-3;
  p.optimizer = make_optimizer(o, registry.parameter_groups(o));
  auto clock = std::make_shared<bench::StepClock>(warmup, device);
  p.callbacks = {clock};
  p.training.batch_size = 64;
  p.training.duration = Duration{warmup + steps, TimeUnit::step};
  p.training.clip_grad_norm = 1.0;
  p.training.log_every = warmup + steps;  // no progress reads inside the timed steps
  p.training.cuda_graph = bench::graph_requested();
  p.precision = Precision::bf16_mixed;
  p.device = device;
  p.prefetch = PrefetchOptions{std::getenv("REFIT_BENCH_WORKERS") ? std::atoi(std::getenv("REFIT_BENCH_WORKERS")) : 0, 4,
                               device.is_cuda()};
  Trainer trainer(std::move(p));
  trainer.fit();
  double ms = clock->ms_per_step();
  nlohmann::json out{{"impl", "refit-trainer"},
                     {"device", dev},
                     {"ms_per_step", ms},
                     {"loss", clock->last_loss.item<double>()},
                     {"host_cache", host_cache},
                     {"malloc", process_malloc()},
                     {"cpu_bf16_products", bf16_products}};
  if (!trainer.cuda_graph_plan().empty()) out["cuda_graph"] = trainer.cuda_graph_plan();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
