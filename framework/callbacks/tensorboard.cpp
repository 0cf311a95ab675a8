#include "callbacks/tensorboard.h"

#include <system_error>

namespace refit {

// Named for the unity build: run/run_report.cpp has helpers of its own in the same batches.
namespace tensorboard_lines {
namespace {

constexpr const char* kEventFilePrefix = "events.out.tfevents.";

bool numeric_field(const nlohmann::json& line, const char* key, double* out) {
  const auto it = line.find(key);
  if (it == line.end() || !it->is_number()) return false;
  *out = it->get<double>();
  return true;
}

}  // namespace
}  // namespace tensorboard_lines

using tensorboard_lines::kEventFilePrefix;
using tensorboard_lines::numeric_field;

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& run_dir, std::vector<std::string> group_names,
                                     std::string recipe_json, bool resuming)
    : events_(without_former_event_files(run_dir, resuming)), group_names_(std::move(group_names)),
      recipe_json_(std::move(recipe_json)) {}

// A fresh run starts the folder's TensorBoard history over, as it truncates metrics.jsonl:
// TensorBoard reads every event file in a folder as one run.
const std::filesystem::path& TensorBoardWriter::without_former_event_files(const std::filesystem::path& run_dir,
                                                                           bool resuming) {
  std::error_code ec;
  if (resuming || !std::filesystem::is_directory(run_dir, ec)) return run_dir;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec))
    if (entry.path().filename().string().rfind(kEventFilePrefix, 0) == 0 && entry.is_regular_file(ec))
      std::filesystem::remove(entry.path(), ec);
  return run_dir;
}

void TensorBoardWriter::on_train_begin(std::int64_t step, bool resumed) {
  const double now = io::unix_seconds_now();
  train_begin_unix_ = now;
  have_previous_ = false;
  // TensorBoard takes the first START of a folder as the beginning and every later one as a
  // restart that drops the events at or above its step: a resumed run keeps what the killed run
  // logged up to the checkpoint's step and drops the rest, which it logs again.
  events_.session_start(resumed ? step + 1 : step, now);
  if (!recipe_json_.empty()) {
    const bool ends_line = recipe_json_.back() == '\n';
    events_.add_text("recipe", "```json\n" + recipe_json_ + (ends_line ? "" : "\n") + "```\n", step, now);
  }
  events_.flush();
}

void TensorBoardWriter::on_line(const nlohmann::json& line) {
  const auto step = line.find("step");
  if (step == line.end() || !step->is_number_integer()) return;
  const std::string kind = line.value("kind", "");
  if (kind == "train") train_line(line, step->get<std::int64_t>());
  if (kind == "eval") eval_line(line, step->get<std::int64_t>());
}

void TensorBoardWriter::on_flush() { events_.flush(); }

void TensorBoardWriter::train_line(const nlohmann::json& line, std::int64_t step) {
  double seconds = 0;
  // The update's own time (lines are written in batches, when the log reads the device).
  const double wall_time = numeric_field(line, "time", &seconds) ? train_begin_unix_ + seconds : io::unix_seconds_now();
  scalar("train/loss", line, "loss", step, wall_time);
  if (line.contains("lr") && line["lr"].is_array()) {
    const auto& lr = line["lr"];
    for (std::size_t g = 0; g < lr.size(); ++g)
      if (lr[g].is_number())
        events_.add_scalar("train/lr/" + (g < group_names_.size() ? group_names_[g] : std::to_string(g)),
                           static_cast<float>(lr[g].get<double>()), step, wall_time);
  }
  scalar("train/grad_norm", line, "grad_norm", step, wall_time);
  scalar("train/grad_norm_clipped", line, "grad_norm_clipped", step, wall_time);
  scalar("train/loss_scale", line, "scale", step, wall_time);
  scalar("train/skipped_total", line, "skipped_total", step, wall_time);
  double samples;
  if (!numeric_field(line, "samples", &samples) || !numeric_field(line, "time", &seconds)) {
    have_previous_ = false;
    return;
  }
  if (have_previous_ && samples > previous_samples_ && seconds > previous_time_)
    events_.add_scalar("train/samples_per_second",
                       static_cast<float>((samples - previous_samples_) / (seconds - previous_time_)), step, wall_time);
  double flops = -1;
  if (!numeric_field(line, "flops", &flops)) flops = -1;
  if (have_previous_ && flops > previous_flops_ && previous_flops_ >= 0 && seconds > previous_time_) {
    const double rate = (flops - previous_flops_) / (seconds - previous_time_);
    events_.add_scalar("train/flops_per_second", static_cast<float>(rate), step, wall_time);
    if (peak_flops_ > 0) events_.add_scalar("train/mfu", static_cast<float>(rate / peak_flops_), step, wall_time);
  }
  previous_flops_ = flops;
  have_previous_ = true;
  previous_samples_ = samples;
  previous_time_ = seconds;
}

void TensorBoardWriter::eval_line(const nlohmann::json& line, std::int64_t step) {
  // The interval across an evaluation counts its time: no throughput for it.
  have_previous_ = false;
  const std::string split = line.value("split", "eval");
  const double now = io::unix_seconds_now();
  for (const auto& [key, value] : line.items())
    if (key != "kind" && key != "split" && key != "step" && key != "iteration" && key != "count")
      if (value.is_number()) events_.add_scalar(split + "/" + key, static_cast<float>(value.get<double>()), step, now);
}

void TensorBoardWriter::scalar(const std::string& tag, const nlohmann::json& line, const char* key, std::int64_t step,
                               double wall_time) {
  double value;
  if (numeric_field(line, key, &value)) events_.add_scalar(tag, static_cast<float>(value), step, wall_time);
}

}  // namespace refit
