#include "callbacks/metrics_log.h"

#include <nlohmann/json.hpp>

#include "refit/error.h"

namespace refit {

MetricsLogCallback::MetricsLogCallback(const std::filesystem::path& file, bool append) {
  std::filesystem::create_directories(file.parent_path());
  out_.open(file, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) throw Error("cannot write metrics log " + file.string());
}

void MetricsLogCallback::on_step_end(const TrainState&, const StepResult& r, TrainerControl&) {
  window_loss_sum_ += r.loss.item<double>() * static_cast<double>(r.count);
  window_count_ += r.count;
  if (!r.window_complete) return;
  nlohmann::json j;
  j["kind"] = "train";
  j["step"] = r.counters.step;
  j["iteration"] = r.counters.iteration;
  j["epoch"] = r.counters.epoch;
  j["samples"] = r.counters.samples;
  j["loss"] = window_count_ ? window_loss_sum_ / static_cast<double>(window_count_) : 0.0;
  j["lr"] = r.learning_rates;
  j["grad_norm"] = r.grad_norm_before.item<double>();
  j["grad_norm_clipped"] = r.grad_norm_after.item<double>();
  j["scale"] = r.scale_before.item<double>();
  j["scale_after"] = r.scale_after.item<double>();
  j["skipped"] = r.skipped.item<bool>();
  j["skipped_total"] = r.counters.skipped_iterations;
  out_ << j.dump() << "\n";
  out_.flush();
  window_loss_sum_ = 0;
  window_count_ = 0;
}

void MetricsLogCallback::on_evaluation_end(const TrainState&, const EvalResult& r, TrainerControl&) {
  nlohmann::json j;
  j["kind"] = "eval";
  j["split"] = r.split;
  j["step"] = r.counters.step;
  j["iteration"] = r.counters.iteration;
  j["count"] = r.count;
  for (const auto& kv : r.metrics) j[kv.first] = kv.second;
  out_ << j.dump() << "\n";
  out_.flush();
}

}  // namespace refit
