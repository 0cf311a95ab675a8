#pragma once
// One JSON object per line in <run dir>/metrics.jsonl: every optimizer update (loss, lr, grad
// norms, scale, skipped) and every evaluation. Device values are read when written: the log is
// the reader that pays for the sync — one device-to-host transfer per optimizer update (the
// window's loss is summed on the device meanwhile).
#include <filesystem>
#include <fstream>

#include <torch/types.h>

#include "refit/callback.h"

namespace refit {

class MetricsLogCallback : public Callback {
 public:
  MetricsLogCallback(const std::filesystem::path& file, bool append);
  void on_step_end(const TrainState&, const StepResult&, TrainerControl&) override;
  void on_evaluation_end(const TrainState&, const EvalResult&, TrainerControl&) override;

 private:
  std::ofstream out_;
  torch::Tensor window_loss_sum_;  // on the device, over the micro-batches of the window
  std::int64_t window_count_ = 0;
};

}  // namespace refit
