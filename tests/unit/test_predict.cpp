// refit predict on the real all-MiniLM-L6-v2: the sentence embeddings it writes are
// transformers' (tests/golden/make_predict_minilm.py).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "cli/commands/predict.h"
#include "core/recipe_parser.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "run/assembly.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace refit;

TEST_CASE("predict: MiniLM embeddings (--outputs features) are transformers' BertModel's, mean pooled and normalised, "
          "within 1e-5 in fp32 (golden)") {
  const fs::path source = test::source_dir(), minilm = test::env_path("REFIT_MINILM_DIR");
  const fs::path base = fs::temp_directory_path() / "refit-tests" / "predict-minilm";
  io::remove_tree(base);
  // The recipe's frozen backbone in float32 with its untrained LoRA (B = 0: the base model), no checkpoint.
  Assembly assembly(load_recipe(source / "recipes/text/minilm-lora-bf16.json",
                                {"models.0.dtype=float32", "training.precision=fp32", "output.dir=" + base.string()}));
  cli::PredictOptions o;
  o.checkpoint = "none";
  o.input = Json{{"type", "text_jsonl"},
                 {"config",
                  {{"tokenizer", minilm.string()}, {"file", (source / "tests/golden/predict/sentences.jsonl").string()}}}}
                .dump();
  o.out = base / "embeddings.jsonl";
  o.models = {"backbone"};
  o.outputs = {"features"};
  o.top_k = 0;       // an embedding model: no class columns
  o.batch_size = 7;  // padded batches, a short last one: padding must not change an embedding
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  CHECK(cli::predict(assembly, o, devnull.get()).count == 24);

  const auto expected =
      io::SafetensorsFile::open(source / "tests/golden/predict/minilm_embeddings.safetensors").load("embedding");
  REQUIRE(expected.sizes() == torch::IntArrayRef({24, 384}));
  std::ifstream in(o.out);
  std::int64_t n = 0;
  double worst = 0;
  for (std::string line; std::getline(in, line); ++n) {
    const Json row = Json::parse(line);
    CHECK(row["id"] == n);
    CHECK_FALSE(row.contains("predicted"));
    const auto features = row["features"].get<std::vector<double>>();
    REQUIRE(features.size() == 384);
    for (std::size_t j = 0; j < 384; ++j)
      worst = std::max(worst, std::abs(features[j] - expected[n][static_cast<std::int64_t>(j)].item<double>()));
  }
  CHECK(n == 24);
  std::cout << "predict MiniLM embeddings vs transformers: max abs difference " << worst << "\n";
  // fp32 through 6 layers of width 384 (reductions of 384 and 1536 terms) on values ~0.05 after
  // normalisation: a few 1e-7; 1e-5 is the bound, and a bf16 backbone (2^-8) fails it.
  CHECK(worst < 1e-5);
}
