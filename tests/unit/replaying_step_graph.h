#pragma once
// A stand-in for CUDA graphs in the loop's tests: "recording" runs the step once on the static
// batch and keeps it, every "launch" runs it again. It exercises the graph executor's logic
// (static inputs, windows, warm-up, fallbacks, outputs) on a CPU, bit for bit like the eager
// path (the same host code runs).
#include <functional>
#include <memory>

#include "train/step_executor.h"
#include "train/step_graph.h"

namespace refit::test {

class ReplayingStepGraph : public StepGraph {
 protected:
  bool record(const std::function<void()>& run, const StepGraph*) override {
    // Unlike a real capture, a step that throws here may have done part of its work.
    try {
      run();
    } catch (const std::exception& e) {
      throw CaptureFailed(e.what());
    }
    recorded_ = run;
    return true;
  }
  void launch() override { recorded_(); }

 private:
  std::function<void()> recorded_;
};

inline StepGraphFactory replaying_step_graphs() {
  return [] { return std::make_unique<ReplayingStepGraph>(); };
}

}  // namespace refit::test
