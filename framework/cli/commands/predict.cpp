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

std::filesystem::path checkpoint_to_use(const Assembly& assembly, const std::optional<std::filesystem::path>& given) {
  if (given) return *given;
  const auto root = assembly.recipe().output_dir / "checkpoints";
  auto latest = latest_checkpoint(root);
  if (!latest) throw Error("no --checkpoint given and none in " + root.string() + " (train first)");
  return *latest;
}

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

}  // namespace

PredictSummary predict(Assembly& assembly, const PredictOptions& options, std::FILE* progress) {
  const auto ext = options.out.extension().string();
  const bool csv = ext == ".csv";
  if (!csv && ext != ".jsonl" && ext != ".json")
    throw Error("--out " + options.out.string() + ": expected a .jsonl or .csv file");
  if (options.top_k < 0) throw Error("--top-k: expected 0 or more");
  // "none": the recipe's own weights (a pretrained encoder used as it is, untrained adapters).
  const bool untrained = options.checkpoint && options.checkpoint->string() == "none";
  const auto dir = untrained ? std::filesystem::path("none") : checkpoint_to_use(assembly, options.checkpoint);
  DatasetPtr data = input_dataset(assembly, options.input);
  std::vector<std::string> chain = options.models;
  if (chain.empty()) chain = assembly.objective()->required_models();
  auto registry = assembly.build_models();
  if (!untrained) load_trainable_weights(dir, *registry);
  const ModelMap models = registry->model_map();
  for (const auto& name : chain) model_named(models, name);  // an unknown name: an error naming the models
  for (auto& m : registry->models()) m.model->eval();

  const TrainingSpec& t = assembly.recipe().training;
  const torch::Device device = assembly.device();
  const Precision precision = assembly.precision();
  const std::int64_t batch_size = options.batch_size > 0 ? options.batch_size : t.batch_size;
  DataLoader loader(data, LoaderOptions{batch_size, false, false, 0});
  const bool has_labels = [&] {
    for (const auto& f : data->fields())
      if (f.name == "labels") return true;
    return false;
  }();

  io::AtomicOutputFile out(options.out);
  if (csv) {
    std::string header = "id";
    if (options.top_k > 0) header += ",predicted,probability";
    if (has_labels) header += ",label";
    if (options.top_k > 0) header += ",top_k";
    for (const auto& o : options.outputs) header += "," + csv_escape(o);
    out.write(header + "\n");
  }
  torch::NoGradGuard no_grad;
  PredictSummary summary;
  std::int64_t correct = 0, labelled = 0;
  bool scores = false;
  const auto started = std::chrono::steady_clock::now();
  const std::int64_t batches = loader.batches_per_epoch();
  for (std::int64_t b = 0; b < batches; ++b) {
    Batch batch = to_device(loader.batch(0, b), device);
    Fields outputs;
    torch::Tensor main;
    {
      AutocastGuard guard(device.type(), autocast_dtype(precision), uses_autocast(precision));
      outputs = run_models(models, chain, batch, main);
    }
    for (const auto& o : options.outputs)
      if (!outputs.has(o)) throw Error("--outputs: no model output named \"" + o + "\" (outputs: " + outputs.list() + ")");
    scores = options.top_k > 0 && main.dim() == 2;
    torch::Tensor probs, predicted, top_p, top_i;
    if (scores) {
      probs = at::softmax(main.to(torch::kFloat), 1);
      predicted = probs.argmax(1).cpu();
      const std::int64_t k = std::min<std::int64_t>(options.top_k, probs.size(1));
      if (k > 0) {
        auto top = probs.topk(k, 1);
        top_p = std::get<0>(top).to(torch::kDouble).cpu();
        top_i = std::get<1>(top).cpu();
      }
    }
    const torch::Tensor labels = has_labels && batch.has("labels") ? batch.at("labels").cpu() : torch::Tensor();
    const torch::Tensor max_p = scores ? std::get<0>(probs.max(1)).to(torch::kDouble).cpu() : torch::Tensor();
    std::string text;
    for (std::int64_t i = 0; i < batch.size(); ++i) {
      const std::int64_t id = summary.count + i;
      Json row;
      row["id"] = id;
      if (scores) {
        row["predicted"] = predicted[i].item<std::int64_t>();
        row["probability"] = max_p[i].item<double>();
        if (top_i.defined()) {
          Json top = Json::array();
          for (std::int64_t j = 0; j < top_i.size(1); ++j)
            top.push_back({top_i[i][j].item<std::int64_t>(), top_p[i][j].item<double>()});
          row["top_k"] = top;
        }
      }
      if (labels.defined()) {
        row["label"] = labels[i].item<std::int64_t>();
        if (scores) correct += row["label"] == row["predicted"] ? 1 : 0, ++labelled;
      }
      for (const auto& o : options.outputs) row[o] = row_json(outputs.at(o), i);
      if (!csv) {
        text += row.dump() + "\n";
        continue;
      }
      text += std::to_string(id);
      if (options.top_k > 0) text += "," + (scores ? row["predicted"].dump() + "," + row["probability"].dump() : ",");
      if (has_labels) text += "," + (row.contains("label") ? row["label"].dump() : "");
      if (options.top_k > 0) text += "," + csv_escape(row.contains("top_k") ? row["top_k"].dump() : "");
      for (const auto& o : options.outputs) text += "," + csv_escape(row[o].dump());
      text += "\n";
    }
    out.write(text);
    summary.count += batch.size();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (progress && ((b + 1) % 20 == 0 || b + 1 == batches))
      std::fprintf(progress, "predict: %lld/%lld inputs  %.0f inputs/s\n", static_cast<long long>(summary.count),
                   static_cast<long long>(data->size()), seconds > 0 ? static_cast<double>(summary.count) / seconds : 0.0);
  }
  out.commit();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (labelled > 0) summary.accuracy = static_cast<double>(correct) / static_cast<double>(labelled);
  if (progress) {
    std::fprintf(progress, "wrote %s: %lld predictions (%s), %.0f inputs/s", options.out.c_str(),
                 static_cast<long long>(summary.count), dir.c_str(),
                 summary.seconds > 0 ? static_cast<double>(summary.count) / summary.seconds : 0.0);
    if (summary.accuracy) std::fprintf(progress, ", accuracy %.4f against the inputs' labels", *summary.accuracy);
    std::fprintf(progress, "\n");
  }
  return summary;
}

}  // namespace refit::cli
