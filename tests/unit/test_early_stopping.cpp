// Early stopping: the policy on sequences of numbers (no model), then in training — a metric
// that stops improving ends the run at the right evaluation, restore_best leaves the best
// evaluated weights as the final checkpoint, and a run resumed from a checkpoint a killed run
// left ends exactly as the straight run did.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>

#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "run_support.h"
#include "test_support.h"
#include "train/checkpoint.h"
#include "train/early_stopping.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_early_stopping {

namespace fs = std::filesystem;
using namespace refit;
using Json = nlohmann::json;

namespace {

EarlyStoppingSpec spec(bool maximize, std::int64_t patience, double min_delta = 0) {
  EarlyStoppingSpec s;
  s.enabled = true;
  s.metric = "score";
  s.maximize = maximize;
  s.patience = patience;
  s.min_delta = min_delta;
  return s;
}

/// The verdicts on `values`, evaluated at steps 10, 20, ...: "+" improved, "." not, "S" stop.
std::string verdicts(EarlyStopping& policy, const std::vector<double>& values) {
  std::string out;
  std::int64_t step = 0;
  for (double v : values) {
    const auto verdict = policy.observe({{"score", v}, {"other", 0.0}}, step += 10);
    out += verdict.stop ? "S" : verdict.improved ? "+" : ".";
  }
  return out;
}

Json recipe(const fs::path& out) {
  return Json{
      {"plugins", {{"load", {"vision", "datasets"}}}},
      {"models",
       {{{"name", "net"},
         {"type", "mlp"},
         {"config", {{"in_features", 8}, {"hidden", {16}}, {"out_features", 3}}},
         {"trainable", true}}}},
      {"data",
       {{"train", {{"type", "synthetic"}, {"config", {{"num_samples", 96}, {"num_features", 8}, {"num_classes", 3}}}}},
        {"val",
         {{"type", "synthetic"},
          {"config", {{"num_samples", 48}, {"num_features", 8}, {"num_classes", 3}, {"sample_seed", 4}}}}}}},
      {"objective", {{"type", "classification"}, {"config", {{"models", {"net"}}}}}},
      {"optimizer", {{"type", "adamw"}, {"lr", 0.01}}},
      {"training",
       {{"duration", "40:step"}, {"batch_size", 8}, {"eval_every", "2:step"}, {"checkpoint_every", "2:step"}, {"seed", 5}}},
      {"output", {{"dir", out.string()}, {"checkpoints", {{"keep_last", 20}}}}}};
}

std::map<std::string, torch::Tensor> weights(const fs::path& checkpoint) {
  return io::SafetensorsFile::open(checkpoint / "trainable.safetensors").load_all();
}

bool same(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, t] : a)
    if (!b.count(k) || !torch::equal(t, b.at(k))) return false;
  return true;
}

Json summary_of(const fs::path& run) {
  Json s;
  std::ifstream(run / "summary.json") >> s;
  return s;
}

}  // namespace

TEST_CASE("early stopping: patience counts evaluations without improvement, min_delta sets the margin, NaN is never best") {
  EarlyStopping falling(spec(/*maximize=*/false, 3));
  CHECK(verdicts(falling, {1.0, 0.9, 0.95, 0.9, 0.92}) == "++..S");  // 0.9 again is no improvement
  CHECK(*falling.best() == 0.9);
  CHECK(*falling.best_step() == 20);

  EarlyStopping rising(spec(/*maximize=*/true, 2));
  CHECK(verdicts(rising, {0.5, 0.6, 0.55, 0.7, 0.7, 0.69}) == "++.+.S");
  CHECK(*rising.best_step() == 40);

  // min_delta 0.1: 0.95 after 1.0 is within the margin, 0.85 beats it.
  EarlyStopping margin(spec(false, 2, 0.1));
  CHECK(verdicts(margin, {1.0, 0.95, 0.85, 0.8, 0.76}) == "+.+.S");
  CHECK(*margin.best() == 0.85);

  const double nan = std::numeric_limits<double>::quiet_NaN();
  EarlyStopping poisoned(spec(false, 2));
  CHECK(verdicts(poisoned, {nan, 1.0, nan, nan}) == ".+.S");
  CHECK(*poisoned.best() == 1.0);
  EarlyStopping never(spec(false, 1));
  const auto v = never.observe({{"score", nan}}, 7);
  CHECK(v.stop);
  CHECK_THAT(v.reason, Catch::Contains("best none"));

  // The reason names the metric, the patience and both values.
  EarlyStopping stopped(spec(false, 1));
  stopped.observe({{"score", 2.0}}, 100);
  CHECK(stopped.observe({{"score", 2.5}}, 200).reason ==
        "early stopping: score has not fallen by more than 0 for 1 evaluation (best 2 at step 100, now 2.5 at step 200)");

  CHECK_THROWS_WITH(stopped.observe({{"loss", 1.0}}, 300), Catch::Contains("reported no metric \"score\""));
}

TEST_CASE("early stopping's state continues the count after a resume, and damaged state is refused unchanged") {
  EarlyStopping first(spec(false, 3));
  CHECK(verdicts(first, {1.0, 0.8, 0.9}) == "++.");
  EarlyStopping resumed(spec(false, 3));
  resumed.load_state_dict(first.state_dict());
  CHECK(*resumed.best() == 0.8);
  CHECK(resumed.evaluations_without_improvement() == 1);
  CHECK(resumed.observe({{"score", 0.85}}, 40).improved == false);
  CHECK(resumed.observe({{"score", 0.81}}, 50).stop);  // the third without improvement, counting the killed run's

  // An evaluation at a step already judged (a resumed run re-evaluating its checkpoint's step) is
  // not judged twice; a stop is kept with its reason.
  EarlyStopping twice(spec(false, 2));
  CHECK(twice.observe({{"score", 1.0}}, 10).improved);
  CHECK_FALSE(twice.observe({{"score", 2.0}}, 20).stop);
  twice.load_state_dict(twice.state_dict());
  CHECK_FALSE(twice.observe({{"score", 2.0}}, 20).stop);  // the same step again
  CHECK(twice.evaluations_without_improvement() == 1);
  CHECK(twice.observe({{"score", 2.0}}, 30).stop);
  EarlyStopping after_stop(spec(false, 2));
  after_stop.load_state_dict(twice.state_dict());
  CHECK(after_stop.stopped());
  CHECK(after_stop.reason() == twice.reason());
  // A resume with a larger patience gives the run more evaluations; another metric or mode starts
  // the judgement afresh (the saved best is of another quantity).
  EarlyStopping more_patient(spec(false, 5));
  more_patient.load_state_dict(twice.state_dict());
  CHECK_FALSE(more_patient.stopped());
  CHECK(more_patient.evaluations_without_improvement() == 2);
  EarlyStopping other_mode(spec(/*maximize=*/true, 2));
  other_mode.load_state_dict(twice.state_dict());
  CHECK_FALSE(other_mode.best());
  CHECK_FALSE(other_mode.stopped());
  // The evaluation at the end of the run's duration counts for the best but stops nothing.
  EarlyStopping at_end(spec(false, 1));
  at_end.observe({{"score", 1.0}}, 10);
  const auto last = at_end.observe({{"score", 2.0}}, 20, /*may_stop=*/false);
  CHECK_FALSE(last.stop);
  CHECK_FALSE(at_end.stopped());

  EarlyStopping fresh(spec(false, 3));
  fresh.load_state_dict(EarlyStopping(spec(false, 3)).state_dict());  // no evaluation yet
  CHECK_FALSE(fresh.best());
  auto damaged = first.state_dict();
  damaged["stale"] = torch::tensor(-1, torch::kLong);
  CHECK_THROWS_WITH(resumed.load_state_dict(damaged), Catch::Contains("negative"));
  damaged = first.state_dict();
  damaged["best"] = torch::tensor({1.0, 2.0}, torch::kDouble);
  CHECK_THROWS_WITH(resumed.load_state_dict(damaged), Catch::Contains("\"best\" is not one"));
  damaged["best"] = torch::tensor(std::nan(""), torch::kDouble);
  CHECK_THROWS_WITH(resumed.load_state_dict(damaged), Catch::Contains("best is not finite"));
  damaged.erase("best");
  CHECK_THROWS_WITH(resumed.load_state_dict(damaged), Catch::Contains("no \"best\""));
  CHECK(*resumed.best() == 0.8);  // unchanged by the refusals
}

TEST_CASE("early stopping in training: the run stops at the right evaluation, restore_best ends with the best "
          "weights, and a resume after a kill ends the same") {
  const fs::path base = fs::temp_directory_path() / "refit-tests" / "early-stopping";
  io::remove_tree(base);
  // The loss falls as the model trains; judged with mode "max" (a stand-in for a metric that
  // gets worse), the first evaluation (step 2) stays the best: evaluations at 4, 6 and 8 do not
  // improve, and with patience 3 the run stops at step 8 instead of 40.
  Json doc = recipe(base / "straight");
  doc["training"]["early_stopping"] = {{"metric", "loss"}, {"mode", "max"}, {"patience", 3}, {"restore_best", true}};
  const TrainSummary summary = test::train_quietly(doc);
  CHECK(summary.counters.step == 8);
  CHECK_THAT(summary.stopped_early, Catch::Contains("early stopping: loss has not risen by more than 0 for 3 evaluations"));
  REQUIRE(summary.restored_best_step);
  CHECK(*summary.restored_best_step == 2);

  // The final checkpoint (what export and predict take) holds the weights evaluated at step 2,
  // and they score what they scored then.
  const fs::path checkpoints = base / "straight" / "checkpoints";
  REQUIRE(latest_checkpoint(checkpoints) == checkpoints / "step-00000008");
  CHECK(same(weights(checkpoints / "step-00000008"), weights(checkpoints / "step-00000002")));
  CHECK_FALSE(same(weights(checkpoints / "step-00000006"), weights(checkpoints / "step-00000002")));
  std::map<std::int64_t, double> val_loss;
  std::ifstream log(base / "straight" / "metrics.jsonl");
  for (std::string line; std::getline(log, line);) {
    const Json j = Json::parse(line);
    if (j["kind"] == "eval") val_loss[j["step"].get<std::int64_t>()] = j["loss"].get<double>();
  }
  CHECK(val_loss.size() == 4);  // steps 2, 4, 6, 8: the re-evaluation of the restored weights is not logged
  const Json s = summary_of(base / "straight");
  CHECK(s["val"]["loss"].get<double>() == val_loss.at(2));
  CHECK(s["restored_best_step"] == 2);
  CHECK_THAT(s["stopped_early"].get<std::string>(), Catch::Contains("best "));

  // Killed after the checkpoint at step 4 (its state holds one evaluation without improvement):
  // the resumed run stops at step 8 too, with the same final weights and reason.
  Json resumed = recipe(base / "resumed");
  resumed["training"]["early_stopping"] = doc["training"]["early_stopping"];
  resumed["training"]["resume"] = (checkpoints / "step-00000004").string();
  const TrainSummary again = test::train_quietly(resumed);
  CHECK(again.counters.step == 8);
  CHECK(again.stopped_early == summary.stopped_early);
  CHECK(same(weights(base / "resumed" / "checkpoints" / "step-00000008"), weights(checkpoints / "step-00000008")));

  // A metric that plateaus (learning rate 0: every evaluation scores the same) stops the run at
  // the patience-th evaluation after the first: steps 2 (best), 4, 6, 8.
  Json flat = recipe(base / "flat");
  flat["optimizer"]["lr"] = 0.0;
  flat["training"]["early_stopping"] = {{"metric", "loss"}, {"patience", 3}};
  const TrainSummary plateau = test::train_quietly(flat);
  CHECK(plateau.counters.step == 8);
  CHECK_THAT(plateau.stopped_early, Catch::Contains("for 3 evaluations (best") && Catch::Contains("at step 2, now"));

  // Without restore_best the run ends with its last weights.
  Json last = recipe(base / "last");
  last["training"]["early_stopping"] = {{"metric", "loss"}, {"mode", "max"}, {"patience", 3}};
  const TrainSummary plain = test::train_quietly(last);
  CHECK(plain.counters.step == 8);
  CHECK_FALSE(plain.restored_best_step);
  CHECK_FALSE(same(weights(base / "last" / "checkpoints" / "step-00000008"), weights(checkpoints / "step-00000002")));
}

TEST_CASE("early stopping's recipe errors: an unreported metric (did you mean), no eval_every, bad keys") {
  Json doc = recipe("/tmp/refit-tests/early-stopping-refused");
  doc["training"]["early_stopping"] = {{"metric", "acuracy"}};
  CHECK_THAT(test::message_at(test::recipe_issues(doc), "/training/early_stopping/metric"),
             Catch::Contains("no evaluation reports the metric \"acuracy\"") &&
                 Catch::Contains("did you mean \"accuracy\""));
  doc["training"]["early_stopping"] = {{"metric", "accuracy"}};
  CHECK(test::recipe_issues(doc).empty());
  doc["training"].erase("eval_every");
  CHECK_THAT(test::message_at(test::recipe_issues(doc), "/training/early_stopping"),
             Catch::Contains("/training/eval_every is not set"));
  doc["training"]["eval_every"] = "2:step";
  doc["training"]["early_stopping"] = {{"metric", "loss"}, {"patience", 0}, {"mode", "lowest"}, {"pateince", 2}};
  const auto issues = test::recipe_issues(doc);
  CHECK_FALSE(test::message_at(issues, "/training/early_stopping/patience").empty());
  CHECK_FALSE(test::message_at(issues, "/training/early_stopping/mode").empty());
  CHECK_THAT(test::message_at(issues, "/training/early_stopping/pateince"), Catch::Contains("did you mean \"patience\""));
}

}  // namespace refit_test_early_stopping
