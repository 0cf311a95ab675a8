// No host synchronisation inside the training step: every read of a tensor's value by the host
// (`.item()`: aten::item / aten::_local_scalar_dense, the call that waits for the device) made
// on the loop's thread is counted with an ATen RecordFunction observer, per step. With the fused AdamW and the "skip" policy, steps between
// progress lines read nothing: gradient unscaling, the non-finite check, clipping, the skip
// decision, the scaler update, EMA models and the metrics log all stay on the device. The
// "raise" policy must read once per window, which shows the counter sees reads.
// (On CUDA the gpu-labelled test runs the same loop under the CUDA sync debug mode.)
#include <atomic>
#include <cstring>
#include <thread>

#include <ATen/record_function.h>

#include "io/remove_tree.h"
#include "run/assembly.h"
#include "run_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_host_sync {

using namespace refit;
namespace fs = std::filesystem;

namespace {

std::atomic<bool> counting{false};
std::atomic<std::thread::id> loop_thread;
std::atomic<int> reads{0};

thread_local int depth = 0;

// Counts reads made by refit's code, i.e. `item` / `_local_scalar_dense` called at the outermost
// op level. Reads nested inside another ATen op are that kernel's business: the CPU fused AdamW
// kernel reads its step counts from host memory (no device involved); its CUDA kernel reads them
// on the device.
std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (depth++ == 0 && counting && std::this_thread::get_id() == loop_thread.load() &&
      (std::strcmp(fn.name(), "aten::item") == 0 || std::strcmp(fn.name(), "aten::_local_scalar_dense") == 0))
    ++reads;
  return nullptr;
}

void on_op_end(const at::RecordFunction&, at::ObserverContext*) { --depth; }

/// Counts reads between on_step_begin and the end of on_step_end of every other callback
/// (it is the last callback): the whole step, the built-in callbacks included.
class SyncCounter : public Callback {
 public:
  std::vector<int> per_step;
  void on_step_begin(const TrainState&, TrainerControl&) override {
    loop_thread = std::this_thread::get_id();
    reads = 0;
    counting = true;
  }
  void on_step_end(const TrainState&, const StepResult&, TrainerControl&) override {
    counting = false;
    per_step.push_back(reads);
  }
};

Json recipe(const fs::path& out, const std::string& precision, const std::string& non_finite) {
  return Json{{"plugins", {{"load", {"vision", "datasets"}}}},
              {"models",
               {{{"name", "net"},
                 {"type", "mlp"},
                 {"config", {{"in_features", 16}, {"hidden", {32, 32}}, {"out_features", 4}}},
                 {"trainable", true}},
                {{"name", "net_ema"}, {"ema", {{"of", "net"}, {"momentum", 0.9}}}}}},
              {"data",
               {{"train",
                 {{"type", "synthetic"}, {"config", {{"num_samples", 256}, {"num_features", 16}, {"num_classes", 4}}}}}}},
              {"objective", {{"type", "classification"}, {"config", {{"models", {"net"}}}}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 0.01}}},
              {"scheduler", {{"type", "cosine"}, {"warmup_iterations", 2}}},
              {"training",
               {{"duration", "16:step"},
                {"batch_size", 8},
                {"gradient_accumulation", 2},
                {"precision", precision},
                {"clip_grad_norm", 1.0},
                {"non_finite", non_finite},
                {"log_every", 1000},
                {"seed", 1}}},
              {"output", {{"dir", out.string()}, {"checkpoints", {{"enabled", false}}}}}};
}

std::vector<int> reads_per_step(const std::string& precision, const std::string& non_finite) {
  auto out = fs::temp_directory_path() / "refit-tests" / ("host-sync-" + precision + "-" + non_finite);
  io::remove_tree(out);
  auto counter = std::make_shared<SyncCounter>();
  auto handle =
      at::addGlobalCallback(at::RecordFunctionCallback(&on_op_start, &on_op_end).scopes({at::RecordScope::FUNCTION}));
  try {
    test::train_quietly(recipe(out, precision, non_finite), {counter});
  } catch (...) {
    at::removeCallback(handle);
    throw;
  }
  at::removeCallback(handle);
  return counter->per_step;
}

}  // namespace

TEST_CASE("host syncs: none inside the step with fused AdamW (bf16-mixed, fp16-mixed with the scaler, clipping, EMA)") {
  for (const char* precision : {"bf16-mixed", "fp16-mixed", "fp32"}) {
    INFO(precision);
    auto per_step = reads_per_step(precision, "skip");
    REQUIRE(per_step.size() == 16);
    // The last step prints the final progress line (a reader: loss, grad norm, skip count).
    for (std::size_t s = 0; s + 1 < per_step.size(); ++s) {
      INFO("step " << s + 1);
      CHECK(per_step[s] == 0);
    }
    CHECK(per_step.back() > 0);
  }
}

TEST_CASE("host syncs: the raise policy reads the non-finite flag once per window (the counter sees reads)") {
  auto per_step = reads_per_step("bf16-mixed", "raise");
  REQUIRE(per_step.size() == 16);
  for (std::size_t s = 0; s + 1 < per_step.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(per_step[s] == (s % 2 == 1 ? 1 : 0));  // windows of 2: the read comes at the window's end
  }
}

}  // namespace refit_test_host_sync
