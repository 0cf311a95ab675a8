// Benchmark: recipes/llm/smollm2-wordnet-lora.json's training step (SmolLM2-135M-Instruct frozen
// in bf16 from its GGUF, LoRA r=8 fp32 on every attention and MLP projection, bf16 autocast,
// chunked causal-LM cross-entropy, AdamW, clip 1.0, batch 2 of WordNet pairs packed into
// sequences of at most 256 tokens) through `refit train`'s own code (cli::train); with
// REFIT_BENCH_NF4=1 the base is stored in NF4 (recipes/llm/smollm2-wordnet-qlora.json), with
// REFIT_BENCH_GGUF=1 kept in the GGUF's Q4_1 blocks (that recipe, "dtype": "gguf").
// Python peer: bench/peer_smollm2_lora.py (transformers LlamaForCausalLM from the same GGUF + PEFT,
// eager, one fixed batch of 2 x 256 tokens). Prints one JSON line. REFIT_SMOLLM2_GGUF must be
// set (scripts/env.sh).
//   smollm2_lora_step RECIPES_DIR [cpu|cuda] [steps]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_support.h"
#include "core/recipe_parser.h"
#include "run/assembly.h"

using namespace refit;

int main(int argc, char** argv) {
  const bool host_cache = bench::use_train_host_allocator();
  const std::string bf16_products = bench::configure_bf16_products();
  if (argc < 2) {
    std::fprintf(stderr, "usage: smollm2_lora_step RECIPES_DIR [cpu|cuda] [steps]\n");
    return 2;
  }
  const std::filesystem::path recipes = argv[1];
  const std::string dev = argc > 2 ? argv[2] : "cpu";
  const std::int64_t steps = argc > 3 ? std::stoll(argv[3]) : 8, warmup = 3;
  const char* nf4 = std::getenv("REFIT_BENCH_NF4");
  const char* gguf = std::getenv("REFIT_BENCH_GGUF");
  const bool quantized = (nf4 && std::string(nf4) == "1") || (gguf && std::string(gguf) == "1");
  const auto file = recipes / (quantized ? "llm/smollm2-wordnet-qlora.json" : "llm/smollm2-wordnet-lora.json");
  std::vector<std::string> overrides{"training.duration=" + std::to_string(warmup + steps) + ":step",
                                     "training.device=" + dev,
                                     "data.train.config.limit=" + std::to_string(8 * (warmup + steps)),
                                     "output.dir=" +
                                         (std::filesystem::temp_directory_path() / "refit-bench-smollm2").string(),
                                     "output.checkpoints.enabled=false",
                                     "training.eval_at_start=false"};
  if (gguf && std::string(gguf) == "1") overrides.push_back("models.0.dtype=gguf");  // the file's Q4_1 blocks as read
  Recipe recipe = load_recipe(file, overrides);
  recipe.val_data.reset();
  recipe.test_data.reset();
  recipe.training.eval_every.reset();
  Assembly assembly(std::move(recipe));
  bench::train_and_report(assembly, dev, warmup, host_cache, bf16_products);
  return 0;
}
