#include "cli/commands/predict.h"

#include <unistd.h>

#include <chrono>
#include <exception>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/utils.h>

#include "data/loader.h"
#include "distributed/process_group.h"
#include "distributed/world.h"
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

/// Turns predictions into JSON lines or CSV rows (the header first, for CSV), counting the
/// predictions that match their labels.
class RowFormatter {
 public:
  RowFormatter(const PredictOptions& options, bool has_labels, std::vector<std::string> class_names)
      : options_(options), csv_(options.out.extension() == ".csv"), has_labels_(has_labels), names_(std::move(class_names)) {
  }

  std::string header() const {
    if (!csv_) return "";
    std::string header = "id";
    if (options_.top_k > 0) header += names_.empty() ? ",predicted,probability" : ",predicted,class,probability";
    if (has_labels_) header += ",label";
    if (options_.top_k > 0) header += ",top_k";
    for (const auto& o : options_.outputs) header += "," + csv_escape(o);
    return header + "\n";
  }

  /// The batch's rows (ids from `first_id`).
  std::string rows(const BatchPredictions& p, std::int64_t first_id) {
    std::string text;
    for (std::int64_t i = 0; i < p.size; ++i) {
      const Json row = row_of(p, i, first_id + i);
      if (row.contains("label") && row.contains("predicted")) correct_ += row["label"] == row["predicted"], ++labelled_;
      text += csv_ ? csv_line(row) : row.dump() + "\n";
    }
    return text;
  }
  std::int64_t correct() const { return correct_; }
  std::int64_t labelled() const { return labelled_; }

 private:
  /// The class's name, when the classes have names and the scores one column per class.
  std::optional<std::string> name_of(std::int64_t c) const {
    if (c < 0 || c >= static_cast<std::int64_t>(names_.size())) return std::nullopt;
    return names_[static_cast<std::size_t>(c)];
  }
  Json row_of(const BatchPredictions& p, std::int64_t i, std::int64_t id) const {
    Json row;
    row["id"] = id;
    if (p.predicted.defined()) {
      const std::int64_t predicted = p.predicted.data_ptr<std::int64_t>()[i];
      row["predicted"] = predicted;
      if (auto name = name_of(predicted)) row["class"] = *name;
      row["probability"] = p.probability.data_ptr<double>()[i];
      const auto classes = p.top_class.accessor<std::int64_t, 2>();
      const auto probabilities = p.top_probability.accessor<double, 2>();
      Json top = Json::array();
      for (std::int64_t j = 0; j < p.top_class.size(1); ++j) {
        Json entry = {classes[i][j], probabilities[i][j]};
        if (auto name = name_of(classes[i][j])) entry.push_back(*name);
        top.push_back(entry);
      }
      row["top_k"] = top;
    }
    if (p.labels.defined()) row["label"] = p.labels.data_ptr<std::int64_t>()[i];
    for (const auto& o : options_.outputs) row[o] = row_json(p.outputs.at(o), i);
    return row;
  }
  std::string csv_line(const Json& row) const {
    std::string line = row["id"].dump();
    auto field = [&](const char* key) {
      if (!row.contains(key)) return std::string();
      return row[key].is_string() ? csv_escape(row[key].get<std::string>()) : row[key].dump();
    };
    if (options_.top_k > 0) {
      line += "," + field("predicted");
      if (!names_.empty()) line += "," + field("class");
      line += "," + field("probability");
    }
    if (has_labels_) line += "," + field("label");
    if (options_.top_k > 0) line += "," + csv_escape(row.contains("top_k") ? row["top_k"].dump() : std::string());
    for (const auto& o : options_.outputs) line += "," + csv_escape(row[o].dump());
    return line + "\n";
  }

  const PredictOptions& options_;
  const bool csv_, has_labels_;
  const std::vector<std::string> names_;
  std::int64_t correct_ = 0, labelled_ = 0;
};

/// Progress on a terminal: one line redrawn in place with a bar; in a log: a line every 20
/// batches.
class Progress {
 public:
  Progress(std::FILE* out, std::int64_t total) : out_(out), total_(total), tty_(out && isatty(fileno(out))) {}

  void update(std::int64_t done, std::int64_t batches_done, bool last) {
    if (!out_) return;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
    if (!tty_) {
      if (batches_done % 20 == 0 || last)
        std::fprintf(out_, "predict: %lld/%lld inputs  %.0f inputs/s\n", static_cast<long long>(done),
                     static_cast<long long>(total_), rate);
      return;
    }
    if (!last && seconds - drawn_ < 0.1) return;  // ten redraws a second at most
    drawn_ = seconds;
    constexpr int kWidth = 30;
    const double fraction = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
    const int filled = static_cast<int>(fraction * kWidth);
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
    std::fprintf(out_, "\rpredict [%s%s] %3.0f%%  %lld/%lld inputs  %.0f inputs/s  %.0f s left ",
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(), 100 * fraction,
                 static_cast<long long>(done), static_cast<long long>(total_), rate, eta);
    if (last) std::fprintf(out_, "\n");
    std::fflush(out_);
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(); }

 private:
  std::FILE* out_;
  std::int64_t total_;
  bool tty_;
  double drawn_ = -1;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

bool has_field(const Dataset& data, const std::string& name) {
  for (const auto& f : data.fields())
    if (f.name == name) return true;
  return false;
}

/// The classes' names: the input's, else those of the data the model was trained on (an
/// unlabelled input); empty when neither has names.
std::vector<std::string> class_names(Assembly& assembly, const Dataset& input) {
  if (auto names = input.class_names(); !names.empty()) return names;
  if (input.num_classes() > 0) return {};  // classes by index only
  try {
    return assembly.train_data()->class_names();
  } catch (const Error&) {
    return {};  // the training data is not on this machine: indices only, as without names
  }
}

/// Runs `f`, returning its exception instead of throwing it (a rank keeps its failure for the
/// next exchange, so that no other rank is left waiting in a collective).
template <class F>
std::exception_ptr attempt(F&& f) {
  try {
    f();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown error";
  }
}

/// Under torchrun: rank r predicts batches r, r + W, r + 2W, ...; after each round of W batches
/// rank 0 receives the ranks' rows and appends them in batch order, so that the file is the
/// one-process file and rank 0 holds one round at a time. Every exchange also carries each
/// rank's failure (a bad input, rank 0's write): all ranks stop at the same exchange, the failing
/// one with its own error, the others naming it.
class Ranks {
 public:
  Ranks(std::unique_ptr<ProcessGroup> group, torch::Device device) : group_(std::move(group)), device_(device) {}
  int rank() const { return group_ ? group_->rank() : 0; }
  int size() const { return group_ ? group_->size() : 1; }
  bool leader() const { return rank() == 0; }

  /// Every rank's rows, by rank (one process: its own), unless a rank failed: then every rank
  /// throws — its own exception, or an Error naming the rank that failed.
  std::vector<std::string> exchange(std::string rows, const std::exception_ptr& failure, const std::string& what) {
    if (!group_) {
      if (failure) std::rethrow_exception(failure);
      return {std::move(rows)};
    }
    const std::string message = failure ? "e" + message_of(failure) : "o" + rows;
    auto all = group_->all_gather_bytes(message, what);
    if (failure) std::rethrow_exception(failure);
    for (int r = 0; r < size(); ++r)
      if (all[static_cast<std::size_t>(r)][0] == 'e')
        throw Error("rank " + std::to_string(r) +
                    " failed, so every rank stops: " + all[static_cast<std::size_t>(r)].substr(1));
    for (auto& a : all) a.erase(0, 1);
    return all;
  }
  /// Sums over the ranks.
  std::pair<std::int64_t, std::int64_t> sum(std::int64_t a, std::int64_t b) {
    if (!group_) return {a, b};
    auto t = torch::tensor({a, b}, torch::kLong).to(device_);
    group_->all_reduce_sum({t}, "predict's accuracy counts");
    t = t.cpu();
    return {t[0].item<std::int64_t>(), t[1].item<std::int64_t>()};
  }

 private:
  std::unique_ptr<ProcessGroup> group_;
  torch::Device device_;
};

}  // namespace

PredictSummary predict(Assembly& assembly, const PredictOptions& options, std::FILE* progress) {
  const auto ext = options.out.extension().string();
  if (ext != ".csv" && ext != ".jsonl" && ext != ".json")
    throw Error("--out " + options.out.string() + ": expected a .jsonl or .csv file");
  if (options.top_k < 0) throw Error("--top-k: expected 0 or more");
  const torch::Device device = assembly.device();
  // Data-parallel under torchrun: join first, so that a rendezvous problem shows at once.
  std::unique_ptr<ProcessGroup> group;
  if (auto world = world_from_environment())
    group = std::make_unique<ProcessGroup>(*world, assembly.recipe().training.distributed, device);
  Ranks ranks(std::move(group), device);
  if (!ranks.leader()) progress = nullptr;

  // Set up on every rank; the ranks agree that each did before the first round.
  // "none": the recipe's own weights (a pretrained encoder used as it is, untrained adapters).
  const bool untrained = options.checkpoint && options.checkpoint->string() == "none";
  std::filesystem::path dir("none");
  DatasetPtr data;
  std::vector<std::string> chain;
  std::unique_ptr<ModelRegistry> registry;
  ModelMap models;
  const std::int64_t batch_size = options.batch_size > 0 ? options.batch_size : assembly.recipe().training.batch_size;
  std::optional<DataLoader> loader;
  std::optional<RowFormatter> format;
  std::optional<io::AtomicOutputFile> out;
  std::exception_ptr failure = attempt([&] {
    if (!untrained) dir = assembly.checkpoint_to_restore(options.checkpoint);
    data = input_dataset(assembly, options.input);
    if (progress) std::fprintf(progress, "input: %s\n", data->describe().c_str());
    if (progress && ranks.size() > 1)
      std::fprintf(progress, "data-parallel: %d ranks take turns by batch; rank 0 writes the file\n", ranks.size());
    chain = options.models.empty() ? assembly.objective()->required_models() : options.models;
    registry = assembly.build_models();
    if (!untrained) load_trainable_weights(dir, *registry);
    models = registry->model_map();
    for (const auto& name : chain) model_named(models, name);  // an unknown name: an error naming the models
    for (const auto& name : chain)
      if (const std::string d = models.at(name)->describe(); progress && !d.empty())
        std::fprintf(progress, "model %s: %s\n", name.c_str(), d.c_str());
    for (auto& m : registry->models()) m.model->eval();
    loader.emplace(data, LoaderOptions{batch_size, false, false, 0});
    format.emplace(options, has_field(*data, "labels"), class_names(assembly, *data));
    if (ranks.leader()) out.emplace(options.out), out->write(format->header());
  });
  ranks.exchange("", failure, "the start of predict (every rank set up)");

  torch::NoGradGuard no_grad;
  const std::int64_t batches = loader->batches_per_epoch();
  Progress bar(progress, data->size());
  std::int64_t written = 0, round = 0;
  for (; round * ranks.size() < batches; ++round) {
    const std::int64_t b = round * ranks.size() + ranks.rank();
    std::string rows;
    // A failure of rank 0's file in the last round is carried into this one.
    if (!failure && b < batches)
      failure = attempt([&] {
        const Batch batch = to_device(loader->batch(0, b), device);
        rows = format->rows(predict_batch(models, chain, batch, options, assembly.precision(), device), b * batch_size);
      });
    const auto parts = ranks.exchange(std::move(rows), failure, "predict's round " + std::to_string(round));
    if (out)
      failure = attempt([&] {
        for (const auto& part : parts) out->write(part);
      });
    const std::int64_t done = std::min<std::int64_t>(batches, (round + 1) * ranks.size());
    written = std::min<std::int64_t>(data->size(), done * batch_size);
    bar.update(written, done, done == batches);
  }
  if (out && !failure) failure = attempt([&] { out->commit(); });
  ranks.exchange("", failure, "the end of predict (rank 0 wrote the file)");
  const auto [correct, labelled] = ranks.sum(format->correct(), format->labelled());
  PredictSummary summary;
  summary.count = written;
  summary.seconds = bar.seconds();
  if (labelled > 0) summary.accuracy = static_cast<double>(correct) / static_cast<double>(labelled);
  if (!progress) return summary;
  const double per_second = summary.seconds > 0 ? static_cast<double>(summary.count) / summary.seconds : 0.0;
  std::fprintf(progress, "wrote %s: %lld predictions (%s), %.0f inputs/s", options.out.c_str(),
               static_cast<long long>(summary.count), dir.c_str(), per_second);
  if (summary.accuracy) std::fprintf(progress, ", accuracy %.4f against the inputs' labels", *summary.accuracy);
  std::fprintf(progress, "\n");
  return summary;
}

}  // namespace refit::cli
