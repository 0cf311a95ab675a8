// Using a model outside training, on the real all-MiniLM-L6-v2: the sentence embeddings refit
// predict writes are transformers' (tests/golden/make_predict_minilm.py), and the merged export
// holds exactly the keys transformers' BertModel saves (tests/golden/make_bert_merged_export.py,
// which also loads refit's file with transformers).
#include <catch2/catch.hpp>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>

#include "cli/commands/export.h"
#include "cli/commands/predict.h"
#include "core/recipe_parser.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "run/assembly.h"
#include "minilm_depth.h"
#include "numeric_bounds.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_predict {

namespace fs = std::filesystem;
using namespace refit;
using namespace refit::test;

namespace {
// `refit predict --outputs features` on the MiniLM recipe's backbone in fp32 (its untrained LoRA:
// B = 0, the base model; no checkpoint) for the JSON lines `input` (a text_jsonl without
// max_length: the tokenizer folder's declared length), in padded batches of 7 with a short last
// one. Returns the largest difference from the exact embeddings (`exact_fixture`, float64) over
// its bound: refit's, and the fp32 `fixture`'s (transformers' or sentence-transformers').
std::pair<double, double> predict_minilm_embeddings(const std::string& name, const fs::path& input, const fs::path& fixture,
                                                    const fs::path& exact_fixture) {
  const fs::path source = test::source_dir(), minilm = test::env_path("REFIT_MINILM_DIR");
  const fs::path base = fs::temp_directory_path() / "refit-tests" / name;
  io::remove_tree(base);
  Assembly assembly(load_recipe(source / "recipes/text/minilm-lora-bf16.json",
                                {"models.0.dtype=float32", "training.precision=fp32", "output.dir=" + base.string()}));
  cli::PredictOptions o;
  o.checkpoint = "none";
  o.input = Json{{"type", "text_jsonl"}, {"config", {{"tokenizer", minilm.string()}, {"file", input.string()}}}}.dump();
  o.out = base / "embeddings.jsonl";
  o.models = {"backbone"};
  o.outputs = {"features"};
  o.top_k = 0;       // an embedding model: no class columns
  o.batch_size = 7;  // padded batches, a short last one: padding must not change an embedding
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  const auto expected = io::SafetensorsFile::open(exact_fixture).load("embedding");
  REQUIRE(expected.scalar_type() == torch::kDouble);
  CHECK(cli::predict(assembly, o, devnull.get()).count == expected.size(0));
  std::ifstream in(o.out);
  std::int64_t n = 0;
  // refit's and the fixture's fp32 embeddings are each within the probabilistic first-order bound
  // gamma~_n(2^-24) max |exact| of the exact one (numeric_bounds.h): n the depth of MiniLM's
  // normalised mean pooling at the 256 tokens inputs are cut at (an upper bound for shorter
  // inputs). The JSON carries each float exactly (17 digits).
  const double relative = prob_depth_bound(minilm_features_depth(minilm, 256), torch::kFloat);
  const torch::Tensor bound = relative * std::get<0>(expected.abs().max(1, true));
  torch::Tensor ours = torch::zeros_like(expected);
  for (std::string line; std::getline(in, line); ++n) {
    const Json row = Json::parse(line);
    CHECK(row["id"] == n);
    CHECK_FALSE(row.contains("predicted"));
    const auto features = row["features"].get<std::vector<double>>();
    REQUIRE(features.size() == 384);
    REQUIRE(n < expected.size(0));
    ours[n].copy_(torch::tensor(features, torch::kDouble));
  }
  CHECK(n == expected.size(0));
  const auto fp32 = io::SafetensorsFile::open(fixture).load("embedding").to(torch::kDouble);
  return {((ours - expected).abs() / bound).max().item<double>(), ((fp32 - expected).abs() / bound).max().item<double>()};
}
}  // namespace

TEST_CASE("predict: MiniLM embeddings (--outputs features) are transformers' BertModel's, mean pooled and normalised, "
          "in fp32 (golden)") {
  const fs::path golden = fs::path(test::source_dir()) / "tests/golden/predict";
  const auto [ours, theirs] =
      predict_minilm_embeddings("predict-minilm", golden / "sentences.jsonl", golden / "minilm_embeddings.safetensors",
                                golden / "minilm_embeddings_exact.safetensors");
  std::cout << "predict MiniLM embeddings: max |error| / bound refit " << ours << ", transformers " << theirs << "\n";
  check_bound_ratio("embeddings: refit", ours);
  check_bound_ratio("embeddings: transformers", theirs);
}

TEST_CASE("predict: MiniLM embeddings of long inputs (130-337 tokens) are sentence-transformers', truncated at the "
          "folder's max_seq_length 256 (golden)") {
  // A text input without max_length takes the model folder's sentence_bert_config.json
  // max_seq_length (256), as SentenceTransformer does: records of 130-256 tokens are whole, 4
  // longer ones are cut at 256. Truncating at 128 (the old default) moves these embeddings by
  // 0.05-0.5; at 512, the 4 long ones.
  const fs::path golden = fs::path(test::source_dir()) / "tests/golden/predict";
  const auto [ours, theirs] = predict_minilm_embeddings("predict-minilm-long", golden / "long_sentences.jsonl",
                                                        golden / "minilm_long_embeddings.safetensors",
                                                        golden / "minilm_long_embeddings_exact.safetensors");
  std::cout << "predict MiniLM long-input embeddings: max |error| / bound refit " << ours << ", sentence-transformers "
            << theirs << "\n";
  check_bound_ratio("embeddings: refit", ours);
  check_bound_ratio("embeddings: sentence-transformers", theirs);
}

TEST_CASE("export merged: MiniLM's file holds exactly the keys and shapes transformers' BertModel saves (golden, "
          "transformers loads it in the generator)") {
  const fs::path source = test::source_dir();
  const fs::path base = fs::temp_directory_path() / "refit-tests" / "export-minilm";
  io::remove_tree(base);
  Assembly assembly(load_recipe(source / "recipes/text/minilm-lora-bf16.json",
                                {"models.0.dtype=float32", "training.precision=fp32", "output.dir=" + base.string()}));
  const auto written = cli::export_models(assembly, fs::path("none"), "merged", base / "merged", c10::kFloat);
  REQUIRE(std::find(written.begin(), written.end(), base / "merged" / "backbone.safetensors") != written.end());
  auto file = io::SafetensorsFile::open(base / "merged" / "backbone.safetensors");
  Json expected;
  std::ifstream(source / "tests/golden/bert/merged_export_keys.json") >> expected;
  REQUIRE(expected["checked"]["unexpected_keys"].empty());  // what transformers found loading refit's file
  REQUIRE(expected["checked"]["missing_keys"].empty());
  std::set<std::string> theirs, ours;
  for (const auto& [key, shape] : expected["keys"].items()) theirs.insert(key);
  for (const auto& info : file.tensors()) {
    const std::string& key = info.name;
    ours.insert(key);
    if (!expected["keys"].contains(key)) continue;
    INFO(key);
    const auto t = file.load(key);
    CHECK(t.sizes().vec() == expected["keys"][key].get<std::vector<std::int64_t>>());
    CHECK(t.scalar_type() == c10::kFloat);
  }
  std::vector<std::string> only_ours, only_theirs;
  std::set_difference(ours.begin(), ours.end(), theirs.begin(), theirs.end(), std::back_inserter(only_ours));
  std::set_difference(theirs.begin(), theirs.end(), ours.begin(), ours.end(), std::back_inserter(only_theirs));
  CAPTURE(only_ours, only_theirs);
  CHECK(only_ours.empty());  // embeddings.position_ids was one: a buffer transformers 5 does not save
  CHECK(only_theirs.empty());
}

}  // namespace refit_test_predict
