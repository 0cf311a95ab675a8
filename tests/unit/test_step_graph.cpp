// The loop's CUDA-graph logic on a CPU, with emulated graphs (the recorded step re-run on the
// static buffers at every "replay"): which steps capture, replay or run eagerly, accumulation
// windows, shape changes, skips, the eager continuation after a failed capture. What only a real
// capture shows (state created inside it, CUDA's capture state) is for tests/gpu/test_gpu.cpp,
// which runs the same cases with real CUDA graphs.
#include <atomic>

#include "graph_support.h"

using namespace refit;

namespace {

test::Outcome emulated(const char* precision, std::int64_t warmup, std::int64_t long_from, std::int64_t nan_at,
                       std::int64_t k = 1, const std::function<ObjectivePtr(ObjectivePtr)>& wrap = {}) {
  return test::train_pool_net(torch::kCPU, true, precision, warmup, long_from, nan_at, k, wrap);
}

/// Passes through to an objective, throwing at one call, before any work: a capture failing in a
/// way CUDA can close cleanly (an error raised inside the step). (What an invalidated capture
/// does — the run stops — needs a GPU.)
class ThrowsOnce : public Objective {
 public:
  ThrowsOnce(ObjectivePtr inner, int at) : inner_(std::move(inner)), at_(at) {}
  std::vector<std::string> required_models() const override { return inner_->required_models(); }
  LossOutput compute(const ModelMap& m, const Batch& b, const ObjectiveContext& c) override {
    if (calls_++ == at_) throw Error("this forward cannot run in a graph");
    return inner_->compute(m, b, c);
  }
  bool graph_safe() const override { return true; }

 private:
  ObjectivePtr inner_;
  int at_;
  int calls_ = 0;
};

}  // namespace

TEST_CASE("step graph (emulated): warm-up, one capture, replays == the eager run") {
  auto eager = emulated("bf16-mixed", 1000, 1000, -1);
  auto graphed = emulated("bf16-mixed", 3, 1000, -1);
  CHECK(eager.plan == "on");
  CHECK(graphed.plan == "on: step 3 captured; 12 replays, 3 eager steps");
  test::check_same_training(graphed, eager);
}

TEST_CASE("step graph (emulated): accumulation windows use an accumulate and an update graph") {
  auto eager = emulated("bf16-mixed", 1000, 1000, -1, 3);
  auto graphed = emulated("bf16-mixed", 3, 1000, -1, 3);
  CHECK(graphed.plan == "on: step 3 and 5 captured; 10 replays, 4 eager steps");
  test::check_same_training(graphed, eager);
}

TEST_CASE("step graph (emulated): batches of another shape run eagerly") {
  auto eager = emulated("bf16-mixed", 1000, 16, -1);
  auto graphed = emulated("bf16-mixed", 3, 16, -1);
  CHECK(graphed.plan == "on: step 3 captured; 4 replays, 11 eager steps");
  test::check_same_training(graphed, eager);
}

TEST_CASE("step graph (emulated): a NaN batch is skipped in an eager and in a replayed step") {
  auto eager = emulated("bf16-mixed", 1000, 1000, 9);
  auto graphed = emulated("bf16-mixed", 3, 1000, 9);
  CHECK(graphed.skipped_iterations == 2);
  CHECK(graphed.skipped.at(2));
  CHECK(graphed.skipped.at(10));
  test::check_same_training(graphed, eager);
}

TEST_CASE("step graph (emulated): a failed capture leaves the run eager and unchanged") {
  // Call 3 of the objective is the capture of step 3 (steps 0-2 are the warm-up).
  auto wrap = [](ObjectivePtr o) -> ObjectivePtr { return std::make_shared<ThrowsOnce>(std::move(o), 3); };
  auto eager = emulated("bf16-mixed", 1000, 1000, -1, 1);
  auto failed = emulated("bf16-mixed", 3, 1000, -1, 1, wrap);
  CHECK(failed.plan == "off: the capture at step 3 failed (this forward cannot run in a graph)");
  test::check_same_training(failed, eager);
}

TEST_CASE("step graph (emulated): a capture failing inside an accumulation window keeps its gradients") {
  // k = 3: step 3 captures the accumulate graph, 4 replays it, the capture at step 5 (call 5)
  // fails: the window's gradients so far must survive into the eager step 5.
  auto wrap = [](ObjectivePtr o) -> ObjectivePtr { return std::make_shared<ThrowsOnce>(std::move(o), 5); };
  auto eager = emulated("bf16-mixed", 1000, 1000, -1, 3);
  auto failed = emulated("bf16-mixed", 3, 1000, -1, 3, wrap);
  CHECK(failed.plan == "off: the capture at step 5 failed (this forward cannot run in a graph) after 1 replay");
  test::check_same_training(failed, eager);
}

TEST_CASE("step graph (emulated): a warm-up shorter than a window captures the run's first update") {
  // k = 3, warm-up 1: step 1 captures the accumulate graph, step 2 the update graph — before any
  // update has run. (That the optimizer's state is then created before the capture, not inside
  // it, only a real capture can show: tests/gpu/test_gpu.cpp.)
  auto eager = emulated("bf16-mixed", 1000, 1000, -1, 3);
  auto graphed = emulated("bf16-mixed", 1, 1000, -1, 3);
  CHECK(graphed.plan == "on: step 1 and 2 captured; 12 replays, 2 eager steps");
  test::check_same_training(graphed, eager);
}
