// Benchmark: recipes/text/minilm-lora-bf16.json's training step (all-MiniLM-L6-v2 frozen in
// bf16, LoRA r=8 fp32 on every attention projection and dense layer, fp32 head on the normalised
// mean-pooled embedding, bf16 autocast, fused AdamW, clip 1.0, batch 32 of fortunes records
// tokenized to at most 64 tokens by the loader's worker) through `refit train`'s own code (cli::train).
// Python peer: bench/peer_minilm_lora.py (transformers BertModel + PEFT, eager, one fixed batch
// of 32 x 64 tokens). Prints one JSON line. REFIT_MINILM_DIR must be set (scripts/env.sh).
//   minilm_lora_step RECIPES_DIR [cpu|cuda] [steps]
#include <cstdio>
#include <cstdlib>
#include <string>

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
    std::fprintf(stderr, "usage: minilm_lora_step RECIPES_DIR [cpu|cuda] [steps]\n");
    return 2;
  }
  const std::filesystem::path recipes = argv[1];
  const std::string dev = argc > 2 ? argv[2] : "cpu";
  const std::int64_t steps = argc > 3 ? std::stoll(argv[3]) : 20, warmup = 5;
  const auto file = recipes / "text/minilm-lora-bf16.json";
  std::vector<std::string> overrides{"training.gradient_accumulation=1",
                                     "training.duration=" + std::to_string(warmup + steps) + ":step",
                                     "training.device=" + dev,
                                     "output.dir=" +
                                         (std::filesystem::temp_directory_path() / "refit-bench-minilm").string(),
                                     "output.checkpoints.enabled=false"};
  // REFIT_BENCH_CHECKPOINTING=1: the backbone's layers recomputed in the backward (the peer does
  // the same with transformers' gradient_checkpointing_enable).
  if (const char* g = std::getenv("REFIT_BENCH_CHECKPOINTING"); g && std::string(g) == "1")
    overrides.push_back("models.0.gradient_checkpointing=true");
  // REFIT_BENCH_NF4=1: the frozen base's Linear weights in NF4 (QLoRA; the peer uses
  // bitsandbytes' Linear4bit the same way).
  if (const char* q = std::getenv("REFIT_BENCH_NF4"); q && std::string(q) == "1") overrides.push_back("models.0.dtype=nf4");
  // Through load_recipe (it expands ${REFIT_MINILM_DIR}); no evaluation in the timed run.
  Recipe recipe = load_recipe(file, overrides);
  recipe.val_data.reset();
  recipe.test_data.reset();
  recipe.training.eval_every.reset();
  Assembly assembly(std::move(recipe));
  bench::train_and_report(assembly, dev, warmup, host_cache, bf16_products);
  return 0;
}
