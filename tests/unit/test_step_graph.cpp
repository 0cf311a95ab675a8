// The loop's CUDA-graph logic on a CPU, with emulated graphs (the recorded step re-run on the
// static buffers at every "replay"): which steps capture, replay or run eagerly, accumulation
// windows, shape changes, skips, the eager continuation after a failed capture. What only a real
// capture shows (state created inside it, CUDA's capture state) is for tests/gpu/test_gpu.cpp,
// which runs the same cases with real CUDA graphs.
#include <atomic>

#include "graph_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_step_graph {

using namespace refit;

namespace {

/// test::expect_as_eager with emulated graphs on the CPU.
template <class... Args>
test::Outcome as_eager(const std::string& plan, Args&&... args) {
  return test::expect_as_eager(torch::kCPU, true, plan, std::forward<Args>(args)...);
}

}  // namespace

TEST_CASE("step graph (emulated): warm-up, one capture, replays == the eager run") {
  as_eager("on: step 3 captured; 12 replays, 3 eager steps", "bf16-mixed", 3, 1000, -1);
}

TEST_CASE("step graph (emulated): accumulation windows use an accumulate and an update graph") {
  // k = 3 over 16 steps: steps 0-2 warm up; step 3 captures the accumulate graph, 4 replays it,
  // 5 captures the update graph; 3 full windows replay; step 15 (a window of 1) runs eagerly.
  as_eager("on: step 3 and 5 captured; 10 replays, 4 eager steps", "bf16-mixed", 3, 1000, -1, 3);
}

TEST_CASE("step graph (emulated): batches of another shape run eagerly") {
  // Samples 16..31 are longer: steps 4-7 and 12-15 cannot replay the graph captured at step 3.
  as_eager("on: step 3 captured; 4 replays, 11 eager steps", "bf16-mixed", 3, 16, -1);
}

TEST_CASE("step graph (emulated): a NaN batch is skipped in an eager and in a replayed step") {
  // Sample 9 is in step 2 (eager, before the capture) and step 10 (a replay).
  auto graphed = as_eager("on: step 3 captured; 12 replays, 3 eager steps", "bf16-mixed", 3, 1000, 9);
  CHECK(graphed.skipped_iterations == 2);
  CHECK(graphed.skipped.at(2));
  CHECK(graphed.skipped.at(10));
}

TEST_CASE("step graph (emulated): after a failed capture the run goes on eagerly, in or out of a window") {
  // k = 1: call 3 of the objective is the capture of step 3 (steps 0-2 warm up). k = 3: step 3
  // captures the accumulate graph, 4 replays it, the capture at step 5 (call 5) fails: the
  // window's gradients so far must survive into the eager step 5.
  as_eager("off: the capture at step 3 failed (this forward cannot run in a graph)", "bf16-mixed", 3, 1000, -1, 1,
           test::failing_at(3));
  as_eager("off: the capture at step 5 failed (this forward cannot run in a graph) after 1 replay", "bf16-mixed", 3, 1000,
           -1, 3, test::failing_at(5));
}

TEST_CASE("step graph (emulated): a warm-up shorter than a window captures the run's first update") {
  // k = 3, warm-up 1: step 1 captures the accumulate graph, step 2 the update graph — before any
  // update has run. (That the optimizer's state is then created before the capture, not inside
  // it, only a real capture can show: tests/gpu/test_gpu.cpp.)
  as_eager("on: step 1 and 2 captured; 12 replays, 2 eager steps", "bf16-mixed", 1, 1000, -1, 3);
}

}  // namespace refit_test_step_graph
