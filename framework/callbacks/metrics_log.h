#pragma once
// One JSON object per line in <run dir>/metrics.jsonl: every optimizer update (loss, lr, grad
// norms, scale, skipped, the seconds since this process began training) and every evaluation.
// Device values are not read when an update ends: each update's values are stacked on the
// device, and the log reads every pending update in one
// device-to-host transfer when it flushes — at the steps where the progress line reads the
// device anyway (step % log_every == 0 and the last step), before an evaluation is written,
// when a checkpoint is saved and at the end.
//
// The log is part of a checkpoint's state: state_dict() writes every pending line and returns the
// log's length in bytes, so a checkpoint in place implies the lines up to its step are on disk. A
// resumed run cuts the log back to that length (dropping the lines a killed run logged after the
// checkpoint, which the resumed run logs again), so the log holds exactly one line per logged
// step. An evaluation the resumed run repeats at the checkpoint's own step (the end-of-run one)
// is not logged twice.
//
// A listener (the TensorBoard event file, callbacks/tensorboard.h) is told of every line the log
// writes, in the order it writes them, and of each flush.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "refit/callback.h"

namespace refit {

/// Follows the metrics log: another record of the same lines.
class MetricsLogListener {
 public:
  virtual ~MetricsLogListener() = default;
  /// Training begins at `step`; `resumed`: from a checkpoint whose log state the log restored.
  virtual void on_train_begin(std::int64_t step, bool resumed) = 0;
  /// A line as the log writes it (before JSON turns non-finite numbers into null).
  virtual void on_line(const nlohmann::json& line) = 0;
  /// The log has flushed its lines to the file.
  virtual void on_flush() = 0;
};

class MetricsLogCallback : public Callback {
 public:
  MetricsLogCallback(const std::filesystem::path& file, bool append, std::int64_t log_every = 1);
  void on_train_begin(const TrainState&, TrainerControl&) override;
  void on_step_end(const TrainState&, const StepResult&, TrainerControl&) override;
  void on_evaluation_begin(const TrainState&, TrainerControl&) override;
  void on_evaluation_end(const TrainState&, const EvalResult&, TrainerControl&) override;
  void on_checkpoint_saved(const TrainState&, const std::string&, TrainerControl&) override;
  void on_train_end(const TrainState&, TrainerControl&) override;
  /// {"log_lines": the log's length in lines with every pending line written, "step": the last step logged}.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  void set_listener(std::shared_ptr<MetricsLogListener> listener) { listener_ = std::move(listener); }
  /// The FLOPs of one update once counted (callbacks/compute_meter.h; 0 before): train lines
  /// then carry "flops", the run's FLOPs up to that update (iterations x that count).
  void set_flops_per_update(std::function<std::int64_t()> flops) { flops_per_update_ = std::move(flops); }

 private:
  void flush();

  std::filesystem::path file_;
  std::ofstream out_;
  std::int64_t last_step_ = 0;                    // of the last update seen
  std::int64_t resumed_at_ = -1;                  // the checkpoint's step, on a resume
  std::vector<std::string> evaluated_at_resume_;  // splits the log holds at that step
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
  std::shared_ptr<MetricsLogListener> listener_;
  std::function<std::int64_t()> flops_per_update_;
};

}  // namespace refit
