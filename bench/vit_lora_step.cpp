// Benchmark: the quickstart's training step (ViT with the DINOv2 architecture frozen in bf16,
// LoRA r=8 fp32 on query/value/attention-output/fc1/fc2, fp32 head, bf16 autocast, fused AdamW,
// clip 1.0, batch 64) through `refit train`'s own code (cli::train), on real Fashion-MNIST batches decoded
// and augmented by the loader's worker thread. Python peer: bench/peer_vit_lora.py (eager
// PyTorch + PEFT, one fixed batch). Prints one JSON line.
//   vit_lora_step RECIPES_DIR [cpu|cuda] [steps]
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "bench_support.h"
#include "cli/commands/train.h"
#include "core/recipe_parser.h"
#include "run/assembly.h"

using namespace refit;


int main(int argc, char** argv) {
  const bool host_cache = bench::use_train_host_allocator();
  const std::string bf16_products = bench::configure_bf16_products();
  if (argc < 2) {
    std::fprintf(stderr, "usage: vit_lora_step RECIPES_DIR [cpu|cuda] [steps]\n");
    return 2;
  }
  const std::filesystem::path recipes = argv[1];
  const std::string dev = argc > 2 ? argv[2] : "cpu";
  const std::int64_t steps = argc > 3 ? std::stoll(argv[3]) : 50, warmup = 10;
  std::ifstream in(recipes / "quickstart.json");
  Json doc = Json::parse(in);
  doc["data"].erase("val");
  doc["data"].erase("test");
  doc["training"].erase("eval_every");
  doc["training"]["gradient_accumulation"] = 1;
  doc["training"]["duration"] = std::to_string(warmup + steps) + ":step";
  doc["training"]["device"] = dev;
  doc["output"] = {{"dir", (std::filesystem::temp_directory_path() / "refit-bench-vit").string()},
                   {"checkpoints", {{"enabled", false}}}};
  Assembly assembly(parse_recipe(doc, recipes));
  bench::train_and_report(assembly, dev, warmup, host_cache, bf16_products);
  return 0;
}
