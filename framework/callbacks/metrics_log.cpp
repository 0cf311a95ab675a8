#include "callbacks/metrics_log.h"

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "refit/error.h"

namespace refit {

MetricsLogCallback::MetricsLogCallback(const std::filesystem::path& file, bool append) {
  std::filesystem::create_directories(file.parent_path());
  out_.open(file, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) throw Error("cannot write metrics log " + file.string());
}

void MetricsLogCallback::on_step_end(const TrainState&, const StepResult& r, TrainerControl&) {
  auto weighted = r.loss.detach() * static_cast<double>(r.count);
  window_loss_sum_ = window_loss_sum_.defined() ? window_loss_sum_ + weighted : weighted;
  window_count_ += r.count;
  if (!r.window_complete) return;
  // One transfer for every value of the line.
  auto as_double = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble).reshape({}); };
  auto host = torch::stack({as_double(window_loss_sum_), as_double(r.grad_norm_before), as_double(r.grad_norm_after),
                            as_double(r.scale_before), as_double(r.scale_after), as_double(r.skipped)})
                  .to(torch::kCPU);
  const double* v = host.data_ptr<double>();
  nlohmann::json j;
  j["kind"] = "train";
  j["step"] = r.counters.step;
  j["iteration"] = r.counters.iteration;
  j["epoch"] = r.counters.epoch;
  j["samples"] = r.counters.samples;
  j["loss"] = window_count_ ? v[0] / static_cast<double>(window_count_) : 0.0;
  j["lr"] = r.learning_rates;
  j["grad_norm"] = v[1];
  j["grad_norm_clipped"] = v[2];
  j["scale"] = v[3];
  j["scale_after"] = v[4];
  j["skipped"] = v[5] != 0.0;
  j["skipped_total"] = r.counters.skipped_iterations;
  out_ << j.dump() << "\n";
  out_.flush();
  window_loss_sum_ = torch::Tensor();
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
