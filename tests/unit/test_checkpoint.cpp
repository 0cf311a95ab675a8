// Checkpoints: retention as a pure function; exact resume (also inside an accumulation window);
// a checkpoint of another frozen base is refused.
#include <fstream>
#include <functional>
#include <limits>

#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "run/session.h"
#include "run_support.h"
#include "test_support.h"
#include "train/checkpoint.h"
#include "train/retention.h"

using namespace refit;
namespace fs = std::filesystem;

TEST_CASE("retention keeps the newest N, the best N by metric, and always the latest") {
  std::vector<CheckpointRecord> r{{10, 0.9}, {20, 0.5}, {30, 0.7}, {40, std::nullopt}, {50, 0.8}};
  CHECK(checkpoints_to_delete(r, {}).empty());
  CHECK(checkpoints_to_delete(r, {2, 0, "loss", false}) == std::vector<std::int64_t>{10, 20, 30});
  CHECK(checkpoints_to_delete(r, {0, 1, "loss", false}) == std::vector<std::int64_t>{10, 30, 40});  // 20 best, 50 latest
  CHECK(checkpoints_to_delete(r, {1, 2, "accuracy", true}) == std::vector<std::int64_t>{20, 30, 40});  // 10, 50 best
  CHECK(checkpoints_to_delete({{7, std::nullopt}}, {1, 1, "loss", false}).empty());
}

namespace {

Json recipe(const fs::path& out, const std::string& duration, std::int64_t accumulation) {
  return Json{{"plugins", {{"load", {"vision", "datasets"}}}},
              {"models",
               {{{"name", "net"},
                 {"type", "mlp"},
                 {"config", {{"in_features", 8}, {"hidden", {16}}, {"out_features", 3}, {"dropout", 0.2}}},
                 {"trainable", true}}}},
              {"data",
               {{"train", {{"type", "synthetic"}, {"config", {{"num_samples", 96}, {"num_features", 8}, {"num_classes", 3}}}}}}},
              {"objective", {{"type", "classification"}, {"config", {{"models", {"net"}}}}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 0.01}}},
              {"scheduler", {{"type", "cosine"}, {"warmup_iterations", 2}}},
              {"training",
               {{"duration", duration},
                {"batch_size", 8},
                {"gradient_accumulation", accumulation},
                {"checkpoint_every", "3:step"},
                {"seed", 5}}},
              {"output", {{"dir", out.string()}}}};
}

std::map<std::string, torch::Tensor> trained(const fs::path& out) {
  return io::SafetensorsFile::open(*latest_checkpoint(out / "checkpoints") / "trainable.safetensors").load_all();
}

void run(Json doc) { test::train_quietly(std::move(doc)); }

}  // namespace

TEST_CASE("resume is bit-exact: N straight == N/2 + resume + N/2, also inside an accumulation window") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "resume";
  io::remove_tree(base);
  // 24 steps, windows of 4, checkpoints every 3 steps: step 9 is inside the third window.
  run(recipe(base / "straight", "24:step", 4));
  auto straight = trained(base / "straight");

  Json resumed = recipe(base / "resumed", "24:step", 4);
  resumed["training"]["resume"] = (base / "straight" / "checkpoints" / "step-00000009").string();
  run(resumed);
  auto after = trained(base / "resumed");
  REQUIRE(after.size() == straight.size());
  for (const auto& kv : straight) {
    INFO(kv.first);
    CHECK(torch::equal(after.at(kv.first), kv.second));
  }
  // And the resumed run did not start over: its log begins after step 9.
  std::ifstream log(base / "resumed" / "metrics.jsonl");
  std::string first;
  std::getline(log, first);
  CHECK(Json::parse(first)["step"].get<int>() == 12);
}

TEST_CASE("a checkpoint of another frozen base is refused, and nothing is changed") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "fingerprint";
  io::remove_tree(base);
  Json doc = recipe(base / "a", "3:step", 1);
  doc["models"][0]["trainable"] = false;
  doc["models"][0]["parameters"] = {{{"match", "layers\\.1\\..*"}, {"trainable", true}}};
  run(doc);
  Json other = doc;
  other["output"]["dir"] = (base / "b").string();
  other["training"]["seed"] = 6;  // another initialisation of the frozen layer
  other["training"]["resume"] = (base / "a" / "checkpoints" / "step-00000003").string();
  // A changed seed alone is refused by the resume fingerprint; allowed here, the frozen base's
  // fingerprint still refuses the checkpoint.
  other["training"]["resume_allow_changes"] = {"/training/seed"};
  CHECK_THROWS_WITH(test::train_quietly(other),
                    Catch::Contains("was trained on another frozen base") && Catch::Contains("refusing to apply it"));
}

namespace {

/// Rewrites <dir>/state.safetensors with `edit` applied to its tensors and metadata.
void rewrite_state(const fs::path& dir,
                   const std::function<void(std::map<std::string, torch::Tensor>&, std::map<std::string, std::string>&)>& edit) {
  auto f = io::SafetensorsFile::open(dir / "state.safetensors");
  auto tensors = f.load_all();
  auto meta = f.metadata();
  edit(tensors, meta);
  io::save_safetensors(dir / "state.safetensors", tensors, meta);
}

}  // namespace

TEST_CASE("checkpoint counters out of range, and in-window gradients of another shape, are refused before any use") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "bad-counters";
  io::remove_tree(base);
  // 12 steps, windows of 2, checkpoints every 3 steps: step 3 is inside a window (gradients saved).
  run(recipe(base / "a", "12:step", 2));
  const fs::path good = base / "a" / "checkpoints" / "step-00000003";
  auto resume_from = [&](const fs::path& dir) {
    Json doc = recipe(base / "b", "12:step", 2);
    doc["training"]["resume"] = dir.string();
    io::remove_tree(base / "b");
    return test::train_quietly(doc);
  };
  auto with_counter = [&](const std::string& key, Json value) {
    const fs::path dir = base / ("bad-" + key + "-" + value.dump());
    io::remove_tree(dir);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(good)) fs::copy_file(e.path(), dir / e.path().filename());
    rewrite_state(dir, [&](auto&, auto& meta) {
      Json c = Json::parse(meta.at("counters"));
      c[key] = value;
      meta["counters"] = c.dump();
    });
    return dir;
  };
  CHECK(resume_from(good).counters.step == 12);
  for (Json step : {Json(-1), Json(std::numeric_limits<std::int64_t>::min()), Json(std::int64_t(1) << 62), Json(13),
                    Json(3.5), Json("3")}) {
    INFO(step.dump());
    CHECK_THROWS_WITH(resume_from(with_counter("step", step)), Catch::Contains("counter step"));
  }
  CHECK_THROWS_WITH(resume_from(with_counter("iteration", 4)), Catch::Contains("counter iteration"));
  CHECK_THROWS_WITH(resume_from(with_counter("iteration", -1)), Catch::Contains("counter iteration"));
  CHECK_THROWS_WITH(resume_from(with_counter("epoch", -2)), Catch::Contains("counter epoch"));
  CHECK_THROWS_WITH(resume_from(with_counter("samples", -8)), Catch::Contains("counter samples"));
  CHECK_THROWS_WITH(resume_from(with_counter("skipped_iterations", 2)), Catch::Contains("counter skipped_iterations"));
  {
    const fs::path dir = with_counter("step", 3);  // an unchanged copy, then its counters damaged
    rewrite_state(dir, [](auto&, auto& meta) { meta["counters"] = "{\"step\": 3"; });
    CHECK_THROWS_WITH(resume_from(dir), Catch::Contains("counters are not a JSON object"));
  }
  {
    const fs::path dir = with_counter("step", 3);
    bool found = false;
    rewrite_state(dir, [&](auto& tensors, auto&) {
      for (auto& [name, t] : tensors)
        if (name.rfind("grad/", 0) == 0) {
          t = torch::zeros({t.numel() + 1});
          found = true;
        }
    });
    REQUIRE(found);
    CHECK_THROWS_WITH(resume_from(dir), Catch::Contains("gradient grad/net/") && Catch::Contains("has another shape"));
  }
  {
    const fs::path dir = with_counter("step", 3);
    rewrite_state(dir, [&](auto& tensors, auto&) { tensors["grad/net/nonexistent"] = torch::zeros({2}); });
    CHECK_THROWS_WITH(resume_from(dir), Catch::Contains("gradient grad/net/nonexistent") &&
                                            Catch::Contains("this run does not have"));
  }
}
