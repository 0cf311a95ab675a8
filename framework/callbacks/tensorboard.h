#pragma once
// The run's TensorBoard event file (`tensorboard --logdir runs/` shows it): the metrics log's
// lines as scalars, and the recipe as text, in `<run dir>/events.out.tfevents.*`.
//
// Tags: every update (a "train" line, at its step): `train/loss`, `train/lr/<group>`,
// `train/grad_norm`, `train/grad_norm_clipped`, `train/loss_scale`, `train/skipped_total` and
// `train/samples_per_second` (between consecutive updates of this process with no evaluation in
// between) and, once the run has counted an update's FLOPs (callbacks/compute_meter.h),
// `train/flops_per_second` and `train/mfu` over the same intervals; every evaluation: `<split>/<metric>` for each metric it reports (loss included).
// The recipe (recipe.json) is the text `recipe`, at the step training begins.
//
// Each process writes its own file. A fresh run removes the files a former run left in the folder
// (as the metrics log starts over); a resumed run starts its file with a SessionLog START one step
// after the checkpoint's, so that TensorBoard drops what a killed run logged after the checkpoint
// (which the resumed run logs again), as the metrics log cuts those lines.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "callbacks/metrics_log.h"
#include "io/event_file.h"

namespace refit {

class TensorBoardWriter : public MetricsLogListener {
 public:
  /// `group_names`: the optimizer's parameter groups, in the order of the lines' "lr" arrays;
  /// `recipe_json`: the recipe as run (empty: no recipe text); `resuming`: keep the folder's
  /// earlier event files (else removed).
  TensorBoardWriter(const std::filesystem::path& run_dir, std::vector<std::string> group_names, std::string recipe_json,
                    bool resuming);

  void on_train_begin(std::int64_t step, bool resumed) override;
  void on_line(const nlohmann::json& line) override;
  void on_flush() override;
  const std::filesystem::path& path() const { return events_.path(); }
  /// The device's peak FLOP/s (perf/peak_flops.h): lines with "flops" then give `train/mfu` too.
  void set_peak_flops(double flops_per_second) { peak_flops_ = flops_per_second; }

 private:
  void train_line(const nlohmann::json& line, std::int64_t step);
  void eval_line(const nlohmann::json& line, std::int64_t step);
  /// The line's number `key` as the scalar `tag` (nothing when it is absent or not a number).
  void scalar(const std::string& tag, const nlohmann::json& line, const char* key, std::int64_t step, double wall_time);

  static const std::filesystem::path& without_former_event_files(const std::filesystem::path& run_dir, bool resuming);

  io::EventFileWriter events_;
  std::vector<std::string> group_names_;
  std::string recipe_json_;
  double train_begin_unix_ = io::unix_seconds_now();  // the lines' "time" counts from here
  // The previous update of this process, for samples/s; none after an evaluation.
  bool have_previous_ = false;
  double previous_samples_ = 0;
  double previous_time_ = 0;
  double previous_flops_ = -1;  // -1: the previous line had no "flops"
  double peak_flops_ = 0;
};

}  // namespace refit
