// Checkpoints: retention as a pure function; exact resume (also inside an accumulation window);
// a checkpoint of another frozen base is refused.
#include <algorithm>
#include <fstream>
#include <functional>
#include <limits>
#include <set>

#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "precision/grad_scaler.h"
#include "cli/commands/evaluate.h"
#include "cli/commands/predict.h"
#include "core/recipe_parser.h"
#include "run/assembly.h"
#include "run_support.h"
#include "test_support.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/retention.h"
#include "train/rng.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_checkpoint {

using namespace refit;
namespace fs = std::filesystem;

namespace {
/// A checkpoint ranked by an evaluation of its own weights (at its step), or unranked.
CheckpointRecord own(std::int64_t step, std::optional<double> metric) {
  return {step, metric, metric ? std::optional<std::int64_t>(step) : std::nullopt};
}
}  // namespace

TEST_CASE("retention keeps the newest N, the best N by metric, and always the latest") {
  std::vector<CheckpointRecord> r{own(10, 0.9), own(20, 0.5), own(30, 0.7), own(40, std::nullopt), own(50, 0.8)};
  CHECK(checkpoints_to_delete(r, {}).empty());
  CHECK(checkpoints_to_delete(r, {2, 0, "loss", false}) == std::vector<std::int64_t>{10, 20, 30});
  CHECK(checkpoints_to_delete(r, {0, 1, "loss", false}) == std::vector<std::int64_t>{10, 30, 40});     // 20 best, 50 latest
  CHECK(checkpoints_to_delete(r, {1, 2, "accuracy", true}) == std::vector<std::int64_t>{20, 30, 40});  // 10, 50 best
  CHECK(checkpoints_to_delete({own(7, std::nullopt)}, {1, 1, "loss", false}).empty());
}

TEST_CASE("retention ranks a checkpoint only by an evaluation of its own weights") {
  // 20's metric came from the evaluation at step 15 (other weights), 30's records no step (refit
  // 0.4): neither is ranked, however good; 10 is the best of its own.
  std::vector<CheckpointRecord> r{own(10, 0.9), {20, 0.1, 15}, {30, 0.2, std::nullopt}, own(40, 0.95)};
  CHECK(checkpoints_to_delete(r, {0, 1, "loss", false}) == std::vector<std::int64_t>{20, 30});
  CHECK(checkpoint_after_evaluation({0, 1, "loss", false}));
  CHECK_FALSE(checkpoint_after_evaluation({3, 0, "loss", false}));
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
               {{"train",
                 {{"type", "synthetic"}, {"config", {{"num_samples", 96}, {"num_features", 8}, {"num_classes", 3}}}}}}},
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

TEST_CASE("a base read from a weights file is fingerprinted by the file: resume with it, refuse another file") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "fingerprint-file";
  io::remove_tree(base);
  fs::create_directories(base);
  // The weights file: the recipe's own initialisation, written out.
  Json doc = recipe(base / "a", "3:step", 1);
  const fs::path weights = base / "net.safetensors";
  {
    auto models = Assembly(parse_recipe(doc, "/tmp")).build_models();
    std::map<std::string, torch::Tensor> state;
    for (const auto& p : models->models()[0].model->named_parameters()) state[p.key()] = p.value().detach();
    io::save_safetensors(weights, state);
  }
  doc["models"][0]["weights"] = weights.string();
  doc["models"][0]["trainable"] = false;
  doc["models"][0]["parameters"] = {{{"match", "layers\\.1\\..*"}, {"trainable", true}}};
  run(doc);
  const std::string checkpoint = (base / "a" / "checkpoints" / "step-00000003").string();
  {
    // The run fingerprinted the file's digest, not the bytes of the base it built.
    auto models = Assembly(parse_recipe(doc, "/tmp")).build_models();
    REQUIRE_FALSE(models->models()[0].weights.digest.empty());
    const auto meta = io::SafetensorsFile::open(fs::path(checkpoint) / "trainable.safetensors").metadata();
    CHECK(meta.at("base_fingerprint") == base_fingerprint(*models));
    CHECK(meta.at("base_fingerprint") != base_fingerprint(*models, BaseFingerprint::bytes));
  }
  Json again = doc;
  again["output"]["dir"] = (base / "b").string();
  again["training"]["duration"] = "6:step";
  again["training"]["resume"] = checkpoint;
  again["training"]["resume_allow_changes"] = {"/training/duration"};
  CHECK_NOTHROW(test::train_quietly(again));  // the same file: the same base
  // One weight of the frozen first layer changed in the file: another base.
  auto tensors = io::SafetensorsFile::open(weights).load_all();
  tensors.at("layers.0.weight")[0][0] += 1;
  io::save_safetensors(weights, tensors);
  again["output"]["dir"] = (base / "c").string();
  CHECK_THROWS_WITH(test::train_quietly(again),
                    Catch::Contains("was trained on another frozen base") && Catch::Contains("refusing to apply it"));
}

TEST_CASE("models built without fresh identity adapters (generate --checkpoint none) have no plain LoRA, and need no "
          "trainable parameter") {
  Json doc = recipe(fs::temp_directory_path() / "refit-tests" / "no-fresh-adapters", "1:step", 1);
  doc["plugins"]["load"].push_back("lora");
  doc["models"][0]["trainable"] = false;
  doc["models"][0]["adapters"] = {{{"type", "lora"}, {"config", {{"r", 2}, {"target_regex", "layers\\.0"}}}}};
  const Assembly assembly(parse_recipe(doc, "/tmp"));
  const auto with = assembly.build_models();
  CHECK(with->models()[0].adapters.size() == 1);
  const auto without = assembly.build_models(/*fresh_adapters=*/false);
  CHECK(without->models()[0].adapters.empty());
  for (const auto& p : without->models()[0].parameters) CHECK_FALSE(p.trainable);
  // A fresh DoRA adapter is not the identity (its magnitude rescales by a rounded norm): kept.
  doc["models"][0]["adapters"][0]["config"]["use_dora"] = true;
  CHECK(Assembly(parse_recipe(doc, "/tmp")).build_models(false)->models()[0].adapters.size() == 1);
}

namespace {

/// Rewrites <dir>/state.safetensors with `edit` applied to its tensors and metadata.
void rewrite_state(
    const fs::path& dir,
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
    CHECK_THROWS_WITH(resume_from(dir),
                      Catch::Contains("gradient grad/net/nonexistent") && Catch::Contains("this run does not have"));
  }
}

namespace {

/// The log's lines without each update's wall-clock seconds ("time"), which no two runs share.
std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    Json j = Json::parse(line);
    j.erase("time");
    out.push_back(j.dump());
  }
  return out;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Reads the metrics log while a checkpoint is being written (its state_dict() is asked for
/// after the metrics log's): the number of train lines on disk at that instant, by step.
class LogAtSave : public Callback {
 public:
  explicit LogAtSave(fs::path log) : log_(std::move(log)) {}
  StateDict state_dict() const override {
    std::int64_t n = 0;
    for (const auto& line : lines_of(log_)) n += Json::parse(line)["kind"] == "train";
    seen.push_back(n);
    return {};
  }
  mutable std::vector<std::int64_t> seen;

 private:
  fs::path log_;
};

}  // namespace

TEST_CASE("a resumed run's metrics log holds one line per logged step, and a checkpoint implies its lines are on disk") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "metrics-resume";
  io::remove_tree(base);
  auto doc = [&](const std::string& dir) {
    Json d = recipe(base / dir, "12:step", 1);
    d["training"]["log_every"] = 1000;  // lines wait on the device until a flush
    return d;
  };
  // Checkpoints every 3 steps: at each save, the lines of every step so far are on disk.
  auto probe = std::make_shared<LogAtSave>(base / "straight" / "metrics.jsonl");
  test::train_quietly(doc("straight"), {probe});
  CHECK(probe->seen == std::vector<std::int64_t>{3, 6, 9, 12});
  const auto straight = lines_of(base / "straight" / "metrics.jsonl");
  REQUIRE(straight.size() == 12);

  // A run that went on past the checkpoint at step 6 (as a run killed at step 8 would have
  // logged 7 and 8) resumes from it: the log is cut back to step 6 and holds each step once.
  test::train_quietly(doc("resumed"));
  io::write_file_atomic(base / "resumed" / "checkpoints" / "latest", "step-00000006\n");
  Json again = doc("resumed");
  again["training"]["resume"] = "latest";
  test::train_quietly(again);
  CHECK(lines_of(base / "resumed" / "metrics.jsonl") == straight);
}

TEST_CASE("a run starts by removing what a killed run left in checkpoints/, and retention keeps what latest names") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "leftovers";
  io::remove_tree(base);
  Json doc = recipe(base / "run", "6:step", 1);
  doc["output"]["checkpoints"] = {{"keep_last", 1}};
  test::train_quietly(doc);
  const fs::path root = base / "run" / "checkpoints";
  REQUIRE(entries(root) == std::vector<std::string>{"latest", "step-00000006"});
  // What kills leave: a checkpoint moved out of the way but not yet removed, the temporary
  // folder and file of a dead process (pids above pid_max never run), an empty step folder (a
  // file-by-file delete cut short); a live process's temporary folder (pid 1) is not touched.
  fs::create_directories(root / ".deleting-step-00000003");
  std::ofstream(root / ".deleting-step-00000003" / "state.safetensors") << "x";
  fs::create_directories(root / ".step-00000009.tmp-999999999");
  std::ofstream(root / ".step-00000009.tmp-999999999" / "trainable.safetensors") << "x";
  std::ofstream(root / ".latest.tmp-999999999-AbCdEf") << "step-00000009";
  fs::create_directories(root / "step-00000004");
  fs::create_directories(root / ".step-00000009.tmp-1");
  // A run killed after its step-6 save put latest back to step 3 (a resumed run re-doing steps
  // 4..6): retention keeps the checkpoint latest names, whatever keep_last says.
  fs::create_directories(root / "step-00000003");
  for (const auto& e : fs::directory_iterator(root / "step-00000006"))
    fs::copy_file(e.path(), root / "step-00000003" / e.path().filename());
  rewrite_state(root / "step-00000003", [](auto&, auto& meta) {
    Json c = Json::parse(meta.at("counters"));
    c["step"] = 3;
    c["iteration"] = 3;
    meta["counters"] = c.dump();
  });
  io::write_file_atomic(root / "latest", "step-00000003\n");
  apply_retention(root, RetentionPolicy{1, 0, "loss", false});
  CHECK(fs::exists(root / "step-00000003"));
  CHECK(fs::exists(root / "step-00000006"));

  Json more = doc;
  more["training"]["duration"] = "9:step";
  more["training"]["resume"] = "latest";
  test::train_quietly(more);
  CHECK(entries(root) == std::vector<std::string>{".step-00000009.tmp-1", "latest", "step-00000009"});
}

TEST_CASE("keep_best: a checkpoint after every evaluation, each ranked by the evaluation of its own weights") {
  // Evaluations every 4 steps, checkpoints every 3: before, the checkpoint at step 6 was ranked by
  // the evaluation at step 4 (other weights). Now each evaluation leaves a checkpoint at its step
  // that records its metric and that step; the periodic ones (3, 6, 9) carry no metric, are not
  // ranked, and keep_best (with the newest kept) deletes them.
  fs::path base = fs::temp_directory_path() / "refit-tests" / "keep-best";
  io::remove_tree(base);
  Json doc = recipe(base, "12:step", 1);
  doc["data"]["val"] = {{"type", "synthetic"},
                        {"config", {{"num_samples", 32}, {"num_features", 8}, {"num_classes", 3}, {"sample_seed", 9}}}};
  doc["training"]["eval_every"] = "4:step";
  doc["output"]["checkpoints"] = {{"keep_best", 10}, {"metric", "loss"}};
  run(doc);
  std::map<std::int64_t, double> val_loss;  // step -> the evaluation's loss, from metrics.jsonl
  std::ifstream log(base / "metrics.jsonl");
  for (std::string line; std::getline(log, line);) {
    Json j = Json::parse(line);
    if (j["kind"] == "eval") val_loss[j["step"].get<std::int64_t>()] = j["loss"].get<double>();
  }
  REQUIRE(val_loss.size() == 3);  // steps 4, 8, 12
  std::set<std::int64_t> kept;
  for (const auto& e : fs::directory_iterator(base / "checkpoints")) {
    if (e.path().filename().string().rfind("step-", 0) != 0) continue;
    auto meta = io::SafetensorsFile::open(e.path() / "state.safetensors").metadata();
    const std::int64_t step = Json::parse(meta.at("counters"))["step"].get<std::int64_t>();
    kept.insert(step);
    INFO("checkpoint at step " << step);
    REQUIRE(meta.count("metric"));
    REQUIRE(meta.count("metric_step"));
    CHECK(std::stoll(meta.at("metric_step")) == step);
    CHECK(Json::parse(meta.at("metric")).get<double>() == val_loss.at(step));
  }
  CHECK(kept == std::set<std::int64_t>{4, 8, 12});
}

TEST_CASE("keep_best without eval_every is refused: only the final checkpoint would be evaluated") {
  Json doc = recipe("/tmp/refit-tests/keep-best-refused", "12:step", 1);
  doc["data"]["val"] = doc["data"]["train"];
  doc["output"]["checkpoints"] = {{"keep_best", 2}};
  CHECK_THAT(test::message_at(test::recipe_issues(doc), "/output/checkpoints/keep_best"),
             Catch::Contains("/training/eval_every is not set"));
  doc["training"]["eval_every"] = "4:step";
  CHECK(test::recipe_issues(doc).empty());
}

TEST_CASE("refit evaluate: a checkpoint scored on val and test as training scored it") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "evaluate";
  io::remove_tree(base);
  Json doc = recipe(base, "6:step", 1);
  doc["data"]["val"] = {{"type", "synthetic"},
                        {"config", {{"num_samples", 40}, {"num_features", 8}, {"num_classes", 3}, {"sample_seed", 9}}}};
  doc["data"]["test"] = {{"type", "synthetic"},
                         {"config", {{"num_samples", 24}, {"num_features", 8}, {"num_classes", 3}, {"sample_seed", 10}}}};
  doc["training"]["eval_every"] = "3:step";
  run(doc);
  Json summary;
  std::ifstream(base / "summary.json") >> summary;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  Assembly assembly(parse_recipe(doc, "/tmp"));
  // The latest checkpoint (step 6) is what training evaluated last.
  const EvalResult test = cli::evaluate(assembly, std::nullopt, "test", devnull.get());
  const EvalResult val = cli::evaluate(assembly, std::nullopt, "val", devnull.get());
  CHECK(test.count == 24);
  CHECK(val.count == 40);
  for (const char* metric : {"loss", "accuracy"}) {
    INFO(metric);
    CHECK(test.metrics.at(metric) == summary["test"][metric].get<double>());
    CHECK(val.metrics.at(metric) == summary["val"][metric].get<double>());
  }
  // An earlier checkpoint scores its own weights: the evaluation at step 3.
  std::map<std::int64_t, double> val_loss;
  std::ifstream log(base / "metrics.jsonl");
  for (std::string line; std::getline(log, line);) {
    Json j = Json::parse(line);
    if (j["kind"] == "eval") val_loss[j["step"].get<std::int64_t>()] = j["loss"].get<double>();
  }
  const EvalResult at3 = cli::evaluate(assembly, base / "checkpoints" / "step-00000003", "val", devnull.get());
  CHECK(at3.metrics.at("loss") == val_loss.at(3));
  CHECK(at3.metrics.at("loss") != val.metrics.at("loss"));
  // A split the recipe lacks, an unknown one, a missing checkpoint: errors that say so.
  Json no_test = doc;
  no_test["data"].erase("test");
  CHECK_THROWS_WITH(cli::evaluate(Assembly(parse_recipe(no_test, "/tmp")), std::nullopt, "test", devnull.get()),
                    Catch::Contains("the recipe has no /data/test"));
  CHECK_THROWS_WITH(cli::evaluate(assembly, std::nullopt, "tset", devnull.get()), Catch::Contains("did you mean \"test\""));
  CHECK_THROWS_WITH(cli::evaluate(assembly, base / "nowhere", "val", devnull.get()), Catch::Contains("does not exist"));
}

TEST_CASE(
    "refit predict: one line per test input in order, its accuracy equals refit evaluate's, CSV, nothing half-written") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "predict";
  io::remove_tree(base);
  Json doc = recipe(base, "6:step", 1);
  doc["data"]["test"] = {{"type", "synthetic"},
                         {"config", {{"num_samples", 37}, {"num_features", 8}, {"num_classes", 3}, {"sample_seed", 10}}}};
  run(doc);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  Assembly assembly(parse_recipe(doc, "/tmp"));
  const EvalResult test = cli::evaluate(assembly, std::nullopt, "test", devnull.get());

  cli::PredictOptions o;
  o.input = "data:test";
  o.out = base / "predictions.jsonl";
  o.outputs = {"output"};
  o.top_k = 2;
  o.batch_size = 5;  // batches that do not divide the set: the last one is short
  const auto summary = cli::predict(assembly, o, devnull.get());
  CHECK(summary.count == 37);
  std::ifstream in(o.out);
  std::int64_t n = 0, correct = 0;
  for (std::string line; std::getline(in, line); ++n) {
    const Json row = Json::parse(line);
    CHECK(row["id"] == n);
    REQUIRE(row["top_k"].size() == 2);
    CHECK(row["top_k"][0][0] == row["predicted"]);
    CHECK(row["top_k"][0][1].get<double>() >= row["top_k"][1][1].get<double>());
    CHECK(row["output"].size() == 3);  // the model's named output, the class scores
    correct += row["predicted"] == row["label"] ? 1 : 0;
  }
  CHECK(n == 37);
  // The same correct count as the objective's accuracy over the same checkpoint and data.
  CHECK(static_cast<double>(correct) / 37.0 == Approx(test.metrics.at("accuracy")).epsilon(0));
  CHECK(correct == static_cast<std::int64_t>(std::llround(test.metrics.at("accuracy") * 37)));
  REQUIRE(summary.accuracy);
  CHECK(*summary.accuracy == static_cast<double>(correct) / 37.0);

  // CSV: a header, then one row per input.
  o.out = base / "predictions.csv";
  o.outputs = {};
  cli::predict(assembly, o, devnull.get());
  std::ifstream csv(o.out);
  std::string header;
  std::getline(csv, header);
  CHECK(header == "id,predicted,probability,label,top_k");
  std::int64_t rows = 0;
  for (std::string line; std::getline(csv, line);) ++rows;
  CHECK(rows == 37);

  // A dataset component as input; a failure after the first batch leaves no file behind.
  o.input = R"({"type": "synthetic", "config": {"num_samples": 9, "num_features": 8, "num_classes": 3}})";
  o.out = base / "inline.jsonl";
  CHECK(cli::predict(assembly, o, devnull.get()).count == 9);
  o.out = base / "bad.jsonl";
  o.outputs = {"nonexistent"};
  CHECK_THROWS_WITH(cli::predict(assembly, o, devnull.get()), Catch::Contains("no model output named \"nonexistent\""));
  CHECK_FALSE(fs::exists(o.out));
  for (const auto& e : fs::directory_iterator(base)) CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
  // A component nested deeper than any config needs is refused before anything walks it.
  o.input = R"({"type": "synthetic", "config": {"x": )" + std::string(5000, '[') + std::string(5000, ']') + "}}";
  CHECK_THROWS_WITH(cli::predict(assembly, o, devnull.get()), Catch::Contains("--input: the recipe is nested more than 64"));
  o.input = "sets:nothing";
  CHECK_THROWS_WITH(cli::predict(assembly, o, devnull.get()), Catch::Contains("no data set named \"nothing\""));
  o.input = R"({"type": "synthetc", "config": {}})";
  CHECK_THROWS_WITH(cli::predict(assembly, o, devnull.get()), Catch::Contains("did you mean \"synthetic\""));
}

TEST_CASE("refit predict: class names from the input or, for unlabelled inputs, from the training data") {
  fs::path base = fs::temp_directory_path() / "refit-tests" / "predict-names";
  io::remove_tree(base);
  fs::create_directories(base);
  // An MLP on 64 Fashion-MNIST images (Debian's dataset-fashion-mnist): classes with names.
  Json doc = recipe(base / "run", "1:step", 1);
  doc["models"][0]["config"] = {{"in_features", 784}, {"out_features", 10}};
  doc["models"][0]["inputs"] = {{"features", "pixel_values"}};
  doc["data"]["train"] = {{"type", "fashion_mnist"}, {"config", {{"split", "test"}, {"limit", 64}}}};
  run(doc);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  Assembly assembly(parse_recipe(doc, "/tmp"));
  const std::vector<std::string> names{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                       "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  cli::PredictOptions o;
  o.input = "data:train";
  o.out = base / "named.jsonl";
  o.top_k = 3;
  o.batch_size = 16;
  cli::predict(assembly, o, devnull.get());
  std::ifstream in(o.out);
  std::int64_t rows = 0;
  for (std::string line; std::getline(in, line); ++rows) {
    const Json row = Json::parse(line);
    CHECK(row["class"] == names.at(row["predicted"].get<std::size_t>()));
    for (const auto& entry : row["top_k"]) CHECK(entry[2] == names.at(entry[0].get<std::size_t>()));
  }
  CHECK(rows == 64);
  o.out = base / "named.csv";
  cli::predict(assembly, o, devnull.get());
  std::ifstream csv(o.out);
  std::string header, first;
  std::getline(csv, header);
  std::getline(csv, first);
  CHECK(header == "id,predicted,class,probability,label,top_k");
  CHECK_THAT(first, Catch::Contains("\"[["));  // top_k, quoted: it holds commas

  // Unlabelled rows (a CSV of 784 values a row, "label_column": null): no "label", the classes'
  // names are the training data's.
  std::string pixels;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 784; ++i) pixels += std::to_string((i * (r + 3)) % 255) + (i + 1 < 784 ? "," : "\n");
  std::ofstream(base / "pixels.csv") << pixels;
  o.input = R"({"type": "csv", "config": {"path": ")" + (base / "pixels.csv").string() +
            R"(", "label_column": null, "scale": 255, "shape": [1, 28, 28], "field": "pixel_values"}})";
  o.out = base / "unlabelled.jsonl";
  const auto summary = cli::predict(assembly, o, devnull.get());
  CHECK(summary.count == 3);
  CHECK_FALSE(summary.accuracy);
  std::ifstream un(o.out);
  rows = 0;
  for (std::string line; std::getline(un, line); ++rows) {
    const Json row = Json::parse(line);
    CHECK_FALSE(row.contains("label"));
    CHECK(row["class"] == names.at(row["predicted"].get<std::size_t>()));
  }
  CHECK(rows == 3);
}

TEST_CASE("damaged RNG, optimizer and gradient scaler states are refused as refit::Errors before any change (fuzz finds)") {
  // The RNG: LibTorch's set_state() threw c10::Error ("Invalid mt19937 state", a wrong size).
  const auto before = capture_rng();
  for (const torch::Tensor& bad :
       {torch::zeros_like(before.at("cpu")), torch::zeros({3}, torch::kByte), before.at("cpu").to(torch::kFloat)}) {
    auto states = before;
    states["cpu"] = bad;
    CHECK_THROWS_AS(restore_rng(states), Error);
    CHECK(torch::equal(capture_rng().at("cpu"), before.at("cpu")));
  }
  CHECK_NOTHROW(restore_rng(before));

  // The optimizer: item() on a learning rate or step of another shape threw c10::Error; a NaN or
  // negative one was taken.
  auto p = torch::zeros({2, 3}).requires_grad_(true);
  ParameterGroup group;
  group.name = "g", group.parameters = {p}, group.lr = 1e-3, group.eps = 1e-8;
  Optimizer opt(OptimizerSpec{}, {group});
  p.mutable_grad() = torch::ones_like(p);
  opt.step();
  const auto good = opt.state_dict();
  auto with = [&](const std::string& key, const torch::Tensor& value) {
    auto s = good;
    s[key] = value;
    return s;
  };
  const auto nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(opt.load_state_dict(with("group0.lr", torch::tensor({1e-3, 2e-3}, torch::kDouble))),
                    Catch::Contains("group0.lr holds 2 values, not one"));
  CHECK_THROWS_WITH(opt.load_state_dict(with("group0.lr", torch::tensor(nan, torch::kDouble))),
                    Catch::Contains("group0.lr is nan, not a finite number"));
  CHECK_THROWS_WITH(opt.load_state_dict(with("group0.param0.step", torch::zeros({0}, torch::kDouble))),
                    Catch::Contains("group0.param0.step holds 0 values"));
  CHECK_THROWS_WITH(opt.load_state_dict(with("group0.param0.step", torch::tensor(-1.0, torch::kDouble))),
                    Catch::Contains("not a finite integer >= 0"));
  // A later problem leaves the earlier entries unapplied.
  auto late = with("group0.lr", torch::tensor(5.0, torch::kDouble));
  late["group0.param0.exp_avg"] = torch::zeros({3, 2});
  CHECK_THROWS_WITH(opt.load_state_dict(late), Catch::Contains("does not match its parameter's shape"));
  CHECK(opt.lr(0) == 1e-3);
  CHECK_NOTHROW(opt.load_state_dict(good));

  // The gradient scaler: a NaN or negative scale skipped or corrupted every later step.
  GradScaler scaler(GradScalerOptions{}, torch::kCPU);
  auto s = scaler.state_dict();
  s["scale"] = torch::full({1}, nan);
  CHECK_THROWS_WITH(scaler.load_state_dict(s), Catch::Contains("not a finite number >= 0"));
  s["scale"] = torch::full({1}, -1.0);
  CHECK_THROWS_AS(scaler.load_state_dict(s), Error);
  s = scaler.state_dict();
  s["growth_tracker"] = torch::full({1}, -2, torch::kInt);
  CHECK_THROWS_WITH(scaler.load_state_dict(s), Catch::Contains("not an integer >= 0"));
}

}  // namespace refit_test_checkpoint
