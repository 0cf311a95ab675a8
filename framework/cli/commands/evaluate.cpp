#include "cli/commands/evaluate.h"

#include "train/checkpoint.h"
#include "train/evaluation.h"

namespace refit::cli {

namespace {

std::string result_line(const EvalResult& r, const std::filesystem::path& dir) {
  std::string line = r.split + " (" + dir.string() + "):";
  char buf[96];
  for (const auto& [metric, value] : r.metrics) {
    std::snprintf(buf, sizeof buf, "  %s %.4f", metric.c_str(), value);
    line += buf;
  }
  if (r.count > 0) line += "  (" + std::to_string(r.count) + " samples)";
  return line;
}

}  // namespace

EvalResult evaluate(const Assembly& assembly, const std::optional<std::filesystem::path>& checkpoint,
                    const std::string& split, std::FILE* out) {
  if (split != "val" && split != "test")
    throw Error("unknown split \"" + split + "\" (expected val or test)" + did_you_mean(split, {"val", "test"}));
  if (split == "test" && !assembly.has_test_data()) throw Error("--split test: the recipe has no /data/test");
  if (split == "val" && !assembly.has_val_data() && !assembly.has_evaluators())
    throw Error("--split val: the recipe has neither /data/val nor /evaluators");
  const auto dir = assembly.checkpoint_to_restore(checkpoint);
  auto models = assembly.build_models();
  load_trainable_weights(dir, *models);
  const TrainingSpec& t = assembly.recipe().training;
  const torch::Device device = assembly.device();

  EvaluationParts parts;
  parts.models = models.get();
  parts.objective = assembly.objective();
  parts.precision = assembly.precision();
  parts.device = device;
  parts.seed = t.seed;
  std::shared_ptr<DataLoader> data;  // what the objective scores
  std::map<std::string, const Dataset*> sets;
  if (split == "val") {
    if (auto val = assembly.val_data())
      data = parts.val = std::make_shared<DataLoader>(val, LoaderOptions{t.batch_size, false, false, 0});
    for (auto& [name, set] : assembly.data_sets()) {
      parts.eval_sets[name] = std::make_shared<LoaderEvalData>(set, t.batch_size, device);
      sets[name] = set.get();
    }
    parts.evaluators = assembly.evaluators();
  } else {
    data = std::make_shared<DataLoader>(assembly.test_data(), LoaderOptions{t.batch_size, false, false, 0});
  }
  assembly.check_fields(models->model_map(), {{"/data/" + split, data ? &data->dataset() : nullptr}}, sets, *parts.objective,
                        parts.evaluators);
  Evaluation evaluation(std::move(parts));
  const TrainState state;  // scored outside a run: step 0
  EvalResult r = split == "val" ? evaluation.validate(state) : evaluation.evaluate(*data, "test", state);
  std::fprintf(out, "%s\n", result_line(r, dir).c_str());
  return r;
}

}  // namespace refit::cli
