// Benchmark (GPU-bound): ViT-B/14 (DINOv2 architecture, the vision plugin's "vit": 12 layers,
// width 768, 12 heads, MLP 3072) at 224 px, batch 128, frozen in bf16, LoRA r=16 alpha=16 (fp32,
// the lora plugin) on every block's query, key, value, attention output, fc1 and fc2, a trainable
// fp32 Linear(768, 100) head on the CLS token, bf16 autocast, fused AdamW lr 1e-4, clip 1.0,
// through refit's own training loop, on one fixed batch resident on the device (as the Python
// peer, bench/peer_vit_b14_lora.py: timm + PEFT; timm fuses q, k, v into one
// qkv projection, so its LoRA has 2/3 of the qkv factors). Prints one JSON line: ms/step, img/s,
// peak GiB (CUDA), trainable parameters.
//   vit_b14_lora [cpu|cuda] [steps] [batch] [image_size]      (cpu: a smoke run at small sizes;
//                                                             REFIT_BENCH_GRAPH=1: the step as a CUDA graph)
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "bench_support.h"
#include "core/plugin_loader.h"
#include "model/model_registry.h"
#include "objectives/classification.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace refit;

namespace {

template <class T>
std::shared_ptr<T> build(const FactoryTable<T>& table, const std::string& type, Json config) {
  auto issues = std::make_shared<ConfigIssues>();
  auto builder = table.parse(type, "/type", ConfigReader(std::move(config), "/config", issues));
  if (!issues->empty()) throw ConfigError(issues->list());
  return builder(BuildContext{});
}

}  // namespace

int main(int argc, char** argv) {
  const bool host_cache = bench::use_train_host_allocator();
  const std::string bf16_products = bench::configure_bf16_products();
  const std::string dev = argc > 1 ? argv[1] : "cuda";
  const std::int64_t steps = argc > 2 ? std::stoll(argv[2]) : 40;
  const std::int64_t batch = argc > 3 ? std::stoll(argv[3]) : 128;
  const std::int64_t image = argc > 4 ? std::stoll(argv[4]) : 224;
  const std::int64_t warmup = dev == "cuda" ? 10 : 1;
  torch::manual_seed(0);
  torch::Device device(dev == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU));

  Registry factories;
  register_classification_objective(factories);
  PluginLoader loader(factories);
  loader.load("vision");
  loader.load("lora");
  auto backbone = build(factories.models, "vit",
                        Json{{"image_size", image},
                             {"patch_size", 14},
                             {"num_channels", 3},
                             {"hidden_size", 768},
                             {"num_hidden_layers", 12},
                             {"num_attention_heads", 12},
                             {"mlp_ratio", 4},
                             {"layerscale_value", 1e-5},
                             {"output", "cls"}});
  auto head = build(factories.models, "linear_head", Json{{"in_features", 768}, {"out_features", 100}});
  auto lora = build(factories.adapters, "lora",
                    Json{{"r", 16},
                         {"alpha", 16},
                         {"target_regex", "encoder\\.layer\\.[0-9]+\\.(attention\\.attention\\.(query|key|value)|"
                                          "attention\\.output\\.dense|mlp\\.fc[12])"}});
  lora->attach(*backbone);
  ModelRegistry registry(Precision::bf16_mixed);
  ModelSpec frozen{"backbone", false, c10::kBFloat16};
  frozen.rules = lora->parameter_rules();
  registry.add(backbone, frozen, device, {}, {{"lora", lora}});
  registry.add(head, ModelSpec{"head", true}, device);
  std::int64_t trainable = 0;
  for (const auto& m : registry.models())
    for (const auto& p : m.parameters) trainable += p.trainable ? p.tensor.numel() : 0;

  TrainerParts p;
  p.models = &registry;
  auto x = torch::randn({batch, 3, image, image}, torch::TensorOptions().device(device).dtype(torch::kBFloat16));
  auto y = torch::randint(0, 100, {batch}, torch::TensorOptions().device(device).dtype(torch::kLong));
  p.train = std::make_shared<DataLoader>(std::make_shared<bench::FixedBatch>(x, y, "pixel_values"),
                                         LoaderOptions{batch, false, true, 0});
  auto issues = std::make_shared<ConfigIssues>();
  p.objective =
      factories.objectives.parse("classification", "/t",
                                 ConfigReader(Json{{"models", {"backbone", "head"}}}, "/c", issues))(BuildContext{});
  OptimizerSpec o;
  o.lr = 1e-4;
  p.optimizer = make_optimizer(o, registry.parameter_groups(o));
  auto clock = std::make_shared<bench::StepClock>(warmup, device);
  p.callbacks = {clock};
  p.training.batch_size = batch;
  p.training.duration = Duration{warmup + steps, TimeUnit::step};
  p.training.clip_grad_norm = 1.0;
  p.training.log_every = warmup + steps;
  p.training.cuda_graph = bench::graph_requested();
  p.precision = Precision::bf16_mixed;
  p.device = device;
  p.prefetch = PrefetchOptions{0, 2, /*pin_memory=*/false};  // the batch is already on the device
  Trainer trainer(std::move(p));
  trainer.fit();
  const double ms = clock->ms_per_step();
  nlohmann::json out{{"impl", "refit-trainer"},      {"device", dev},     {"batch", batch},
                     {"image_size", image},          {"ms_per_step", ms}, {"img_per_s", batch / ms * 1e3},
                     {"trainable_params", trainable}};
  out["host_cache"] = host_cache;
  out["malloc"] = process_malloc();
  out["cpu_bf16_products"] = bf16_products;
  if (!trainer.cuda_graph_plan().empty()) out["cuda_graph"] = trainer.cuda_graph_plan();
  if (device.is_cuda()) {
    const auto memory = device_memory(device);
    if (memory) out["peak_gib"] = static_cast<double>(memory->peak) / (1024.0 * 1024.0 * 1024.0);
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
