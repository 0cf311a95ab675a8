#pragma once
// One JSON object per line in <run dir>/metrics.jsonl: every optimizer update (loss, lr, grad
// norms, scale, skipped, the seconds since this process began training) and every evaluation.
// Device values are not read when an update ends: each update's values are stacked on the
// device, and the log reads every pending update in one
// device-to-host transfer when it flushes — at the steps where the progress line reads the
// device anyway (step % log_every == 0 and the last step), before an evaluation is written,
// after a checkpoint (so the log on disk covers every checkpointed update) and at the end.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "refit/callback.h"

namespace refit {

class MetricsLogCallback : public Callback {
 public:
  MetricsLogCallback(const std::filesystem::path& file, bool append, std::int64_t log_every = 1);
  void on_train_begin(const TrainState&, TrainerControl&) override;
  void on_step_end(const TrainState&, const StepResult&, TrainerControl&) override;
  void on_evaluation_begin(const TrainState&, TrainerControl&) override;
  void on_evaluation_end(const TrainState&, const EvalResult&, TrainerControl&) override;
  void on_checkpoint_saved(const TrainState&, const std::string&, TrainerControl&) override;
  void on_train_end(const TrainState&, TrainerControl&) override;

 private:
  void flush();

  std::ofstream out_;
  std::int64_t log_every_;
  torch::Tensor window_loss_sum_;  // on the device, over the micro-batches of the window
  std::int64_t window_count_ = 0;
  struct Pending {
    nlohmann::json line;   // host fields (counters, lr, sample count)
    torch::Tensor values;  // device [6]: loss sum, grad norms, scales, skipped
  };
  std::vector<Pending> pending_;
  std::int64_t skipped_total_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace refit
