#include "callbacks/progress.h"

#include <unistd.h>

#include <string>

namespace refit {

namespace {
std::string fmt_seconds(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}
}  // namespace

ProgressCallback::ProgressCallback(std::int64_t log_every, std::FILE* out)
    : log_every_(log_every), out_(out), tty_(isatty(fileno(out)) != 0) {}

void ProgressCallback::on_train_begin(const TrainState& s, TrainerControl&) {
  start_ = last_ = std::chrono::steady_clock::now();
  std::fprintf(out_, "training: %lld steps (%lld per epoch)\n", static_cast<long long>(s.max_steps),
               static_cast<long long>(s.steps_per_epoch));
  std::fflush(out_);
}

void ProgressCallback::on_step_end(const TrainState& s, const StepResult& r, TrainerControl&) {
  if (r.window_complete) last_window_ = r;
  const auto& c = r.counters;
  if (c.step % log_every_ != 0 && c.step != s.max_steps) return;
  auto now = std::chrono::steady_clock::now();
  double dt = std::chrono::duration<double>(now - last_).count();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double rate = dt > 0 ? (c.samples - last_samples_) / dt : 0.0;
  double eta = c.step > 0 ? elapsed / c.step * (s.max_steps - c.step) : 0.0;
  last_ = now;
  last_samples_ = c.samples;
  // Reading the device values here is the logger's host sync, outside the step.
  std::string line = "step " + std::to_string(c.step) + "/" + std::to_string(s.max_steps);
  char buf[256];
  std::snprintf(buf, sizeof buf, "  epoch %.2f", static_cast<double>(c.step) / static_cast<double>(s.steps_per_epoch));
  line += buf;
  std::snprintf(buf, sizeof buf, "  loss %.4f", r.loss.item<double>());
  line += buf;
  if (last_window_.window_complete) {
    if (!last_window_.learning_rates.empty()) {
      std::snprintf(buf, sizeof buf, "  lr %.2e", last_window_.learning_rates.front());
      line += buf;
    }
    std::snprintf(buf, sizeof buf, "  grad_norm %.3f", last_window_.grad_norm_before.item<double>());
    line += buf;
    double scale = last_window_.scale_after.item<double>();
    if (scale != 1.0) {
      std::snprintf(buf, sizeof buf, "  scale %.0f", scale);
      line += buf;
    }
  }
  if (c.skipped_iterations) line += "  skipped " + std::to_string(c.skipped_iterations);
  std::snprintf(buf, sizeof buf, "  %.0f samples/s  eta %s", rate, fmt_seconds(eta).c_str());
  line += buf;
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    line_open_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressCallback::on_evaluation_end(const TrainState&, const EvalResult& r, TrainerControl&) {
  if (line_open_) std::fprintf(out_, "\n"), line_open_ = false;
  std::string line = r.split + " @ step " + std::to_string(r.counters.step) + ":";
  char buf[64];
  for (const auto& kv : r.metrics) {
    std::snprintf(buf, sizeof buf, "  %s %.4f", kv.first.c_str(), kv.second);
    line += buf;
  }
  if (r.count > 0) line += "  (" + std::to_string(r.count) + " samples)";  // objective metrics' sample count
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressCallback::on_train_end(const TrainState& s, TrainerControl&) {
  if (line_open_) std::fprintf(out_, "\n"), line_open_ = false;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(out_, "done: %lld steps, %lld optimizer updates (%lld skipped) in %s\n",
               static_cast<long long>(s.counters.step), static_cast<long long>(s.counters.iteration),
               static_cast<long long>(s.counters.skipped_iterations), fmt_seconds(elapsed).c_str());
  std::fflush(out_);
}

}  // namespace refit
