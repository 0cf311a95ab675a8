#pragma once
// What a person sees: a progress line (step, epoch, loss, lr, grad norm, scale, samples/s, ETA)
// redrawn in place on a terminal, plain log lines otherwise; evaluation results as they come.
#include <chrono>
#include <cstdio>

#include "refit/callback.h"

namespace refit {

class ProgressCallback : public Callback {
 public:
  ProgressCallback(std::int64_t log_every, std::FILE* out);
  void on_train_begin(const TrainState&, TrainerControl&) override;
  void on_step_end(const TrainState&, const StepResult&, TrainerControl&) override;
  void on_evaluation_end(const TrainState&, const EvalResult&, TrainerControl&) override;
  void on_train_end(const TrainState&, TrainerControl&) override;

 private:
  std::int64_t log_every_;
  std::FILE* out_;
  bool tty_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point start_, last_;
  std::int64_t last_samples_ = 0;
  // Latest values of the last completed window (kept on device until printed).
  StepResult last_window_;
};

}  // namespace refit
