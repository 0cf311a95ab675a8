#include "cli/commands/predict.h"

#include <chrono>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/utils.h>

#include "data/loader.h"
#include "io/atomic_output.h"
#include "precision/autocast_guard.h"
#include "train/checkpoint.h"

namespace refit::cli {

namespace {

/// The dataset `spec` names (PredictOptions::input).
DatasetPtr input_dataset(Assembly& assembly, const std::string& spec) {
  if (spec == "data:train") return assembly.train_data();
  if (spec == "data:val" || spec == "data:test") {
    auto d = spec == "data:val" ? assembly.val_data() : assembly.test_data();
    if (!d) throw Error("--input " + spec + ": the recipe has no /data/" + spec.substr(5));
    return d;
  }
  if (spec.rfind("sets:", 0) == 0) {
    std::vector<std::string> names;
    for (auto& [name, set] : assembly.data_sets()) {
      if (name == spec.substr(5)) return set;
      names.push_back(name);
    }
    throw Error("--input " + spec + ": no data set named \"" + spec.substr(5) + "\" in /data/sets" +
                did_you_mean(spec.substr(5), names));
  }
  const std::string trimmed = spec.substr(spec.find_first_not_of(" \t\n"));
  if (!trimmed.empty() && trimmed[0] == '{') {
    Json component;
    try {
      component = Json::parse(trimmed);
    } catch (const Json::exception& e) {
      throw Error("--input: not valid JSON (" + std::string(e.what()) + ")");
    }
    return assembly.dataset(component, std::filesystem::current_path(), "--input");
  }
  const std::filesystem::path file(spec);
  if (file.extension() != ".json")
    throw Error("--input \"" + spec +
                "\": expected data:train, data:val, data:test, sets:NAME, a dataset component "
                "({\"type\": ..., \"config\": {...}}) or a .json file holding one");
  std::ifstream in(file);
  if (!in) throw Error("--input: cannot read " + spec);
  Json component;
  try {
    component = Json::parse(in);
  } catch (const Json::exception& e) {
    throw Error("--input " + spec + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  return assembly.dataset(component, std::filesystem::absolute(file).parent_path(), spec);
}

/// One row of a batch's outputs as JSON: a scalar, or nested lists.
Json row_json(const torch::Tensor& t, std::int64_t row) {
  const torch::Tensor r = t[row].to(torch::kCPU);
  if (r.dim() == 0) return r.is_floating_point() ? Json(r.item<double>()) : Json(r.item<std::int64_t>());
  const torch::Tensor flat = r.is_floating_point() ? r.to(torch::kDouble).contiguous() : r.to(torch::kLong).contiguous();
  if (r.dim() == 1) {
    Json out = Json::array();
    for (std::int64_t i = 0; i < flat.size(0); ++i)
      out.push_back(r.is_floating_point() ? Json(flat.data_ptr<double>()[i]) : Json(flat.data_ptr<std::int64_t>()[i]));
    return out;
  }
  Json out = Json::array();
  for (std::int64_t i = 0; i < r.size(0); ++i) out.push_back(row_json(r, i));
  return out;
}

/// Every model's outputs in the chain: plain names (the first model producing a name wins, so
/// "features" is the backbone's) and "model/field".
Fields run_models(const ModelMap& models, const std::vector<std::string>& chain, const Batch& batch,
                  torch::Tensor& last_main) {
  Fields all;
  torch::Tensor primary;
  for (const auto& name : chain) {
    Fields out = run_chain(models, {name}, batch, primary);
    Model& m = model_named(models, name);
    for (const auto& field : m.output_fields())
      if (out.has(field)) {
        if (!all.has(field)) all.set(field, out.at(field));
        all.set(name + "/" + field, out.at(field));
      }
    primary = out.at(m.main_output());
  }
  last_main = primary;
  return all;
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

/// One batch's predictions, on the host.
struct BatchPredictions {
  std::int64_t size = 0;
  torch::Tensor predicted, probability;      // [B] int64, double: defined when the main output is class scores
  torch::Tensor top_class, top_probability;  // [B, k]
  torch::Tensor labels;                      // [B] int64, when the inputs carry labels
  Fields outputs;                            // every model's outputs (run_models)
};

BatchPredictions predict_batch(const ModelMap& models, const std::vector<std::string>& chain, const Batch& batch,
                               const PredictOptions& options, Precision precision, torch::Device device) {
  BatchPredictions p;
  p.size = batch.size();
  torch::Tensor main;
  {
    AutocastGuard guard(device.type(), autocast_dtype(precision), uses_autocast(precision));
    p.outputs = run_models(models, chain, batch, main);
  }
  for (const auto& o : options.outputs)
    if (!p.outputs.has(o)) throw Error("--outputs: no model output named \"" + o + "\" (outputs: " + p.outputs.list() + ")");
  if (batch.has("labels")) p.labels = batch.at("labels").to(torch::kCPU, torch::kLong);
  if (options.top_k == 0 || main.dim() != 2) return p;  // no class scores
  const torch::Tensor probs = at::softmax(main.to(torch::kFloat), 1);
  auto [top_p, top_i] = probs.topk(std::min<std::int64_t>(options.top_k, probs.size(1)), 1);
  p.top_class = top_i.cpu();
  p.top_probability = top_p.to(torch::kDouble).cpu();
  p.predicted = p.top_class.select(1, 0).contiguous();
  p.probability = p.top_probability.select(1, 0).contiguous();
  return p;
}

/// Writes predictions as JSON lines or CSV rows into a file that appears whole at commit().
class PredictionWriter {
 public:
  PredictionWriter(const PredictOptions& options, bool has_labels)
      : options_(options), csv_(options.out.extension() == ".csv"), has_labels_(has_labels), out_(options.out) {
    if (!csv_) return;
    std::string header = "id";
    if (options.top_k > 0) header += ",predicted,probability";
    if (has_labels) header += ",label";
    if (options.top_k > 0) header += ",top_k";
    for (const auto& o : options.outputs) header += "," + csv_escape(o);
    out_.write(header + "\n");
  }

  /// Writes the batch's rows (ids from `first_id`); counts predictions that match their labels.
  void write(const BatchPredictions& p, std::int64_t first_id) {
    std::string text;
    for (std::int64_t i = 0; i < p.size; ++i) {
      const Json row = row_of(p, i, first_id + i);
      if (row.contains("label") && row.contains("predicted")) correct_ += row["label"] == row["predicted"], ++labelled_;
      text += csv_ ? csv_line(row) : row.dump() + "\n";
    }
    out_.write(text);
  }
  void commit() { out_.commit(); }
  std::optional<double> accuracy() const {
    if (labelled_ == 0) return std::nullopt;
    return static_cast<double>(correct_) / static_cast<double>(labelled_);
  }

 private:
  Json row_of(const BatchPredictions& p, std::int64_t i, std::int64_t id) const {
    Json row;
    row["id"] = id;
    if (p.predicted.defined()) {
      row["predicted"] = p.predicted.data_ptr<std::int64_t>()[i];
      row["probability"] = p.probability.data_ptr<double>()[i];
      const auto classes = p.top_class.accessor<std::int64_t, 2>();
      const auto probabilities = p.top_probability.accessor<double, 2>();
      Json top = Json::array();
      for (std::int64_t j = 0; j < p.top_class.size(1); ++j) top.push_back({classes[i][j], probabilities[i][j]});
      row["top_k"] = top;
    }
    if (p.labels.defined()) row["label"] = p.labels.data_ptr<std::int64_t>()[i];
    for (const auto& o : options_.outputs) row[o] = row_json(p.outputs.at(o), i);
    return row;
  }
  std::string csv_line(const Json& row) const {
    std::string line = row["id"].dump();
    auto field = [&](const char* key) { return row.contains(key) ? row[key].dump() : std::string(); };
    if (options_.top_k > 0) line += "," + field("predicted") + "," + field("probability");
    if (has_labels_) line += "," + field("label");
    if (options_.top_k > 0) line += "," + csv_escape(field("top_k"));
    for (const auto& o : options_.outputs) line += "," + csv_escape(row[o].dump());
    return line + "\n";
  }

  const PredictOptions& options_;
  const bool csv_, has_labels_;
  io::AtomicOutputFile out_;
  std::int64_t correct_ = 0, labelled_ = 0;
};

bool has_field(const Dataset& data, const std::string& name) {
  for (const auto& f : data.fields())
    if (f.name == name) return true;
  return false;
}

}  // namespace

PredictSummary predict(Assembly& assembly, const PredictOptions& options, std::FILE* progress) {
  const auto ext = options.out.extension().string();
  if (ext != ".csv" && ext != ".jsonl" && ext != ".json")
    throw Error("--out " + options.out.string() + ": expected a .jsonl or .csv file");
  if (options.top_k < 0) throw Error("--top-k: expected 0 or more");
  // "none": the recipe's own weights (a pretrained encoder used as it is, untrained adapters).
  const bool untrained = options.checkpoint && options.checkpoint->string() == "none";
  const auto dir = untrained ? std::filesystem::path("none") : assembly.checkpoint_to_restore(options.checkpoint);
  DatasetPtr data = input_dataset(assembly, options.input);
  if (progress) std::fprintf(progress, "input: %s\n", data->describe().c_str());
  std::vector<std::string> chain = options.models.empty() ? assembly.objective()->required_models() : options.models;
  auto registry = assembly.build_models();
  if (!untrained) load_trainable_weights(dir, *registry);
  const ModelMap models = registry->model_map();
  for (const auto& name : chain) model_named(models, name);  // an unknown name: an error naming the models
  for (auto& m : registry->models()) m.model->eval();
  const torch::Device device = assembly.device();
  const std::int64_t batch_size = options.batch_size > 0 ? options.batch_size : assembly.recipe().training.batch_size;
  DataLoader loader(data, LoaderOptions{batch_size, false, false, 0});

  PredictionWriter writer(options, has_field(*data, "labels"));
  torch::NoGradGuard no_grad;
  PredictSummary summary;
  const auto started = std::chrono::steady_clock::now();
  auto rate = [&] {
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return summary.seconds > 0 ? static_cast<double>(summary.count) / summary.seconds : 0.0;
  };
  const std::int64_t batches = loader.batches_per_epoch();
  for (std::int64_t b = 0; b < batches; ++b) {
    const Batch batch = to_device(loader.batch(0, b), device);
    writer.write(predict_batch(models, chain, batch, options, assembly.precision(), device), summary.count);
    summary.count += batch.size();
    if (progress && ((b + 1) % 20 == 0 || b + 1 == batches))
      std::fprintf(progress, "predict: %lld/%lld inputs  %.0f inputs/s\n", static_cast<long long>(summary.count),
                   static_cast<long long>(data->size()), rate());
  }
  writer.commit();
  const double per_second = rate();
  summary.accuracy = writer.accuracy();
  if (!progress) return summary;
  std::fprintf(progress, "wrote %s: %lld predictions (%s), %.0f inputs/s", options.out.c_str(),
               static_cast<long long>(summary.count), dir.c_str(), per_second);
  if (summary.accuracy) std::fprintf(progress, ", accuracy %.4f against the inputs' labels", *summary.accuracy);
  std::fprintf(progress, "\n");
  return summary;
}

}  // namespace refit::cli
