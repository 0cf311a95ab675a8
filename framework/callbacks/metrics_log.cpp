#include "callbacks/metrics_log.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <ATen/ATen.h>

#include "io/fault.h"
#include "refit/error.h"

namespace refit {

MetricsLogCallback::MetricsLogCallback(const std::filesystem::path& file, bool append, std::int64_t log_every)
    : file_(file), log_every_(std::max<std::int64_t>(1, log_every)) {
  std::filesystem::create_directories(file.parent_path());
  out_.open(file, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) throw Error("cannot write metrics log " + file.string());
}

void MetricsLogCallback::on_train_begin(const TrainState& s, TrainerControl&) {
  skipped_total_ = s.counters.skipped_iterations;  // a resumed run continues the count
  start_ = std::chrono::steady_clock::now();
  if (listener_) listener_->on_train_begin(s.counters.step, resumed_at_ >= 0);
}

void MetricsLogCallback::on_step_end(const TrainState& s, const StepResult& r, TrainerControl&) {
  last_step_ = r.counters.step;
  auto weighted = r.loss.detach() * static_cast<double>(r.count);
  window_loss_sum_ = window_loss_sum_.defined() ? window_loss_sum_ + weighted : weighted;
  window_count_ += r.count;
  const bool flush_now = r.counters.step % log_every_ == 0 || r.counters.step == s.max_steps;
  if (!r.window_complete) {
    if (flush_now) flush();
    return;
  }
  auto as_double = [](const torch::Tensor& t) { return t.detach().to(torch::kDouble).reshape({}); };
  Pending p;
  p.values = at::stack({as_double(window_loss_sum_), as_double(r.grad_norm_before), as_double(r.grad_norm_after),
                        as_double(r.scale_before), as_double(r.scale_after), as_double(r.skipped)});
  p.line["kind"] = "train";
  p.line["step"] = r.counters.step;
  p.line["iteration"] = r.counters.iteration;
  p.line["epoch"] = r.counters.epoch;
  p.line["samples"] = r.counters.samples;
  p.line["count"] = window_count_;
  p.line["lr"] = r.learning_rates;
  if (const std::int64_t flops = flops_per_update_ ? flops_per_update_() : 0; flops > 0)
    p.line["flops"] = static_cast<double>(flops) * static_cast<double>(r.counters.iteration);
  // When the host finished the update (on a GPU, when it was queued): throughput in the report.
  p.line["time"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  pending_.push_back(std::move(p));
  window_loss_sum_ = torch::Tensor();
  window_count_ = 0;
  // A cap for runs whose log_every is very large: the pending values live on the device.
  if (flush_now || pending_.size() >= 1024) flush();
}

void MetricsLogCallback::flush() {
  if (pending_.empty()) return;
  std::vector<torch::Tensor> rows;
  for (const auto& p : pending_) rows.push_back(p.values);
  auto host = at::stack(rows).to(torch::kCPU).contiguous();  // one transfer for every pending update
  const double* v = host.data_ptr<double>();
  for (std::size_t i = 0; i < pending_.size(); ++i, v += 6) {
    nlohmann::json& j = pending_[i].line;
    const auto count = j["count"].get<std::int64_t>();
    j.erase("count");
    j["loss"] = count ? v[0] / static_cast<double>(count) : 0.0;
    j["grad_norm"] = v[1];
    j["grad_norm_clipped"] = v[2];
    j["scale"] = v[3];
    j["scale_after"] = v[4];
    j["skipped"] = v[5] != 0.0;
    skipped_total_ += v[5] != 0.0;
    j["skipped_total"] = skipped_total_;
    out_ << j.dump() << "\n";
    if (listener_) listener_->on_line(j);
  }
  io::fault_point("metrics flush");
  out_.flush();
  if (!out_) throw Error("cannot write metrics log " + file_.string());
  pending_.clear();
  if (listener_) listener_->on_flush();
}

void MetricsLogCallback::on_evaluation_begin(const TrainState&, TrainerControl&) { flush(); }

void MetricsLogCallback::on_evaluation_end(const TrainState&, const EvalResult& r, TrainerControl&) {
  flush();
  if (r.counters.step == resumed_at_ &&
      std::find(evaluated_at_resume_.begin(), evaluated_at_resume_.end(), r.split) != evaluated_at_resume_.end())
    return;  // the killed run logged this evaluation before its checkpoint
  nlohmann::json j;
  j["kind"] = "eval";
  j["split"] = r.split;
  j["step"] = r.counters.step;
  j["iteration"] = r.counters.iteration;
  j["count"] = r.count;
  for (const auto& kv : r.metrics) j[kv.first] = kv.second;
  out_ << j.dump() << "\n";
  io::fault_point("metrics evaluation line");
  out_.flush();
  if (listener_) {
    listener_->on_line(j);
    listener_->on_flush();
  }
}

void MetricsLogCallback::on_checkpoint_saved(const TrainState&, const std::string&, TrainerControl&) { flush(); }

StateDict MetricsLogCallback::state_dict() const {
  // Saving a checkpoint writes the pending lines first: once the checkpoint is in place, the log
  // covers every update it holds. (The object is never const; state_dict() is const by interface.)
  // The log's length is kept in lines, not bytes: lines carry wall-clock seconds, so their byte
  // lengths differ between runs that are otherwise identical, and checkpoints must not.
  auto* self = const_cast<MetricsLogCallback*>(this);
  self->flush();
  self->out_.flush();
  std::ifstream in(file_, std::ios::binary);
  if (!in) throw Error("cannot read the metrics log " + file_.string());
  std::int64_t lines = 0;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    lines += std::count(buf, buf + in.gcount(), '\n');
    if (!in) break;
  }
  return {{"log_lines", torch::tensor(lines)}, {"step", torch::tensor(last_step_)}};
}

void MetricsLogCallback::load_state_dict(const StateDict& state) {
  const auto lines = state.find("log_lines");
  const auto step = state.find("step");
  if (lines == state.end() || step == state.end() || lines->second.numel() != 1 || step->second.numel() != 1 ||
      lines->second.scalar_type() != torch::kLong || step->second.scalar_type() != torch::kLong)
    throw Error("checkpoint: the metrics log's state is not {log_lines, step} as int64 scalars (a damaged file?)");
  const std::int64_t n_lines = lines->second.item<std::int64_t>();
  if (n_lines < 0) throw Error("checkpoint: the metrics log's length is negative (a damaged file?)");
  resumed_at_ = step->second.item<std::int64_t>();
  last_step_ = resumed_at_;
  out_.flush();
  // The byte offset just past line n_lines. A log with fewer lines than the checkpoint says
  // belongs to another run directory (a resume from another run's checkpoint): kept as it is.
  std::uintmax_t n = 0;
  {
    std::ifstream scan(file_, std::ios::binary);
    if (!scan) return;
    std::int64_t seen = 0;
    char c;
    while (seen < n_lines && scan.get(c)) {
      ++n;
      if (c == '\n') ++seen;
    }
    if (seen < n_lines) return;
  }
  std::error_code ec;
  const auto size = std::filesystem::file_size(file_, ec);
  if (ec) return;
  if (size > n && ::truncate(file_.c_str(), static_cast<off_t>(n)) != 0)
    throw Error("cannot cut the metrics log " + file_.string() + " back to the checkpoint: " + std::strerror(errno));
  // The evaluations logged at the checkpoint's step (before it was saved).
  std::ifstream in(file_);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("kind", "") == "eval" && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<std::int64_t>() == resumed_at_ && j.contains("split") && j["split"].is_string())
      evaluated_at_resume_.push_back(j["split"].get<std::string>());
  }
}

void MetricsLogCallback::on_train_end(const TrainState&, TrainerControl&) { flush(); }

}  // namespace refit
