#include "train/step_executor.h"

#include <cstdio>
#include <optional>

namespace refit {

namespace {

class EagerExecutor : public StepExecutor {
 public:
  explicit EagerExecutor(StepWork work) : work_(std::move(work)) {}
  StepResult forward_backward(const Batch& batch, std::int64_t window_count, bool, std::int64_t, std::int64_t,
                              std::int64_t) override {
    StepResult result;
    work_.forward_backward(batch, window_count, true, result);
    return result;
  }
  void update(StepResult& result) override { work_.update(result, true); }

 private:
  StepWork work_;
};

class GraphExecutor : public StepExecutor {
 public:
  GraphExecutor(StepWork work, torch::Device device, std::int64_t warmup, StepGraphFactory make_graph)
      : work_(std::move(work)), warmup_(warmup), make_graph_(std::move(make_graph)) {
    side_stream_.emplace(device);
  }

  void begin_window(const std::vector<Batch>& batches) override {
    if (side_stream_) side_stream_->adopt(batches);
  }

  StepResult forward_backward(const Batch& batch, std::int64_t window_count, bool window_end, std::int64_t window,
                              std::int64_t k, std::int64_t step) override {
    StepResult result;
    // Full windows replay the update graph at their last micro-batch and the accumulate graph
    // (k > 1) before it; anything else runs eagerly. (warmup >= 1 eager steps first: every
    // parameter that gets gradients has its buffer by then, so a capture adds into it instead of
    // allocating one inside the graph.)
    std::unique_ptr<StepGraph>* slot = nullptr;
    if (live_ && window == k && eager_steps_ >= warmup_) slot = window_end ? &update_graph_ : &accumulate_graph_;
    if (slot && !*slot) *slot = make_graph_();
    StepGraph* g = slot ? slot->get() : nullptr;
    if (g && g->captured() && g->fits(batch, window_count)) {
      result = g->replay(batch);
      ++replays_;
    } else if (g && !g->captured()) {
      result = capture(*g, batch, window_count, window_end, step);
    }
    last_eager_ = !result.loss.defined();
    if (last_eager_) {
      work_.forward_backward(batch, window_count, !live_, result);
      ++eager_steps_;
    }
    return result;
  }

  void update(StepResult& result) override {
    if (last_eager_) work_.update(result, !live_);
  }


  std::string report() const override {
    if (!failure_.empty()) return failure_;
    if (captured_at_.empty()) return "on";
    std::string at;
    for (auto c : captured_at_) at += (at.empty() ? "" : " and ") + std::to_string(c);
    return "on: step " + at + " captured; " + std::to_string(replays_) + " replays, " + std::to_string(eager_steps_) +
           " eager steps";
  }

 private:
  StepResult capture(StepGraph& g, const Batch& batch, std::int64_t window_count, bool window_end, std::int64_t step) {
    // State a captured update must find in place, not create (creation would be recorded and
    // replayed: moments re-zeroed every step).
    if (window_end) work_.materialize_state();
    std::vector<torch::Tensor> grads_before;  // host handles, restored if the capture fails
    for (const auto& p : work_.trainable) grads_before.push_back(p.grad());
    const StepGraph* other = window_end ? accumulate_graph_.get() : update_graph_.get();
    try {
      // By value: what a capture bakes in (a stand-in graph keeps the step).
      StepResult r = g.capture(
          batch, window_count,
          [work = work_, window_count, window_end](const Batch& b, StepResult& out) {
            work.forward_backward(b, window_count, false, out);
            if (window_end) work.update(out, false);
          },
          other && other->captured() ? other : nullptr);
      captured_at_.push_back(step);
      return r;
    } catch (const StepGraph::CaptureFailed& e) {
      // The capture was closed cleanly and recorded without executing: the step has not run.
      // The run continues eagerly, with every hook.
      for (std::size_t j = 0; j < work_.trainable.size(); ++j) work_.trainable[j].mutable_grad() = grads_before[j];
      update_graph_.reset();
      accumulate_graph_.reset();
      live_ = false;
      failure_ = "off: the capture at step " + std::to_string(step) + " failed (" + e.what() + ")" +
                 (replays_ ? " after " + std::to_string(replays_) + (replays_ == 1 ? " replay" : " replays") : "");
      std::fprintf(stderr, "cuda_graph: the capture failed, continuing eagerly: %s\n", e.what());
      return StepResult{};
    }
  }

  StepWork work_;
  std::int64_t warmup_;
  StepGraphFactory make_graph_;
  std::optional<SideStream> side_stream_;
  std::unique_ptr<StepGraph> update_graph_, accumulate_graph_;  // the window's last micro-batch; the others
  bool live_ = true;
  bool last_eager_ = false;
  std::int64_t eager_steps_ = 0, replays_ = 0;
  std::vector<std::int64_t> captured_at_;
  std::string failure_;
};

}  // namespace

std::unique_ptr<StepExecutor> make_eager_executor(StepWork work) { return std::make_unique<EagerExecutor>(std::move(work)); }

std::unique_ptr<StepExecutor> make_graph_executor(StepWork work, torch::Device device, std::int64_t warmup,
                                                  StepGraphFactory make_graph) {
  return std::make_unique<GraphExecutor>(std::move(work), device, warmup, std::move(make_graph));
}

}  // namespace refit
