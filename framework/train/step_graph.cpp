#include "train/step_graph.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include "cuda/cuda_support.h"
#include "refit/error.h"

namespace refit {

namespace {

bool same_layout(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type());
}

void copy_into(torch::Tensor& dst, const torch::Tensor& src) {
  if (src.defined()) dst.copy_(src, /*non_blocking=*/true);
}

}  // namespace

/// The static batch, the normaliser baked into the step, and the step's outputs, written by
/// every launch: loss, grad norms and scales packed in one float vector so that a launch's
/// values come out in one copy.
struct StepGraph::State {
  bool failed = false;  // a capture failed: this StepGraph is not used again
  bool captured = false;
  Batch input;             // the static batch the recorded step reads
  std::int64_t count = 0;  // the normaliser baked into the step
  torch::Tensor packed, skipped;
  bool window_complete = false;
  std::int64_t result_count = 0;

  void pack(const StepResult& r) {
    window_complete = r.grad_norm_before.defined();
    const auto zero = torch::zeros({}, r.loss.options().dtype(torch::kFloat));
    auto scalar = [&](const torch::Tensor& t) { return t.defined() ? t.reshape({}).to(torch::kFloat) : zero; };
    packed = at::stack({scalar(r.loss), scalar(r.grad_norm_before), scalar(r.grad_norm_after), scalar(r.scale_before),
                        scalar(r.scale_after)});
    skipped = r.skipped;
    result_count = r.count;
  }

  /// This launch's outputs, copied out of the step's buffers (two copies, no host sync).
  StepResult outputs() const {
    auto out = packed.clone();
    StepResult r;
    r.loss = out[0];
    r.count = result_count;
    if (window_complete) {
      r.grad_norm_before = out[1], r.grad_norm_after = out[2];
      r.scale_before = out[3].reshape({1}), r.scale_after = out[4].reshape({1});
      r.skipped = skipped.clone();
    }
    return r;
  }
};

StepGraph::StepGraph() : state_(std::make_unique<State>()) {}

StepGraph::~StepGraph() = default;

bool StepGraph::captured() const { return state_->captured; }

bool StepGraph::fits(const Batch& batch, std::int64_t count) const {
  const Batch& s = state_->input;
  // Called every step: compares in place (both are sorted maps), no lists built.
  if (count != state_->count || batch.size() != s.size() || batch.count() != s.count()) return false;
  for (auto a = batch.begin(), b = s.begin(); b != s.end(); ++a, ++b)
    if (a->first != b->first || !same_layout(a->second, b->second)) return false;
  return true;
}

StepResult StepGraph::capture(const Batch& batch, std::int64_t count, const Step& step, const StepGraph* share_pool_with) {
  State& m = *state_;
  if (m.failed || m.captured) throw Error("cuda_graph: a step graph is captured once (internal error)");
  m.input = Batch{};
  m.input.samples = batch.size();
  for (const auto& [name, t] : batch) m.input.set(name, t.defined() ? t.clone() : t);
  m.count = count;
  // By value: the recorded step may be launched long after this call.
  const std::function<void()> run = [&m, step] {
    StepResult r;
    step(m.input, r);
    m.pack(r);
  };
  bool ran = false;
  try {
    ran = record(run, share_pool_with);
  } catch (...) {
    m.failed = true;
    throw;
  }
  m.captured = true;
  if (!ran) launch();
  return m.outputs();
}

StepResult StepGraph::replay(const Batch& batch) {
  State& m = *state_;
  if (!m.captured) throw Error("cuda_graph: replay of a step graph that was not captured (internal error)");
  for (auto& [name, t] : m.input) copy_into(t, batch.at(name));
  launch();
  return m.outputs();
}

namespace {

/// An exception's message without c10's backtrace (it goes into summary.json).
std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

/// Autocast's cast cache off in a scope. The cache would hand the graph tensors allocated outside
/// it (and keep graph tensors alive outside): PyTorch requires it off while capturing.
struct NoAutocastCache {
  bool was = at::autocast::is_autocast_cache_enabled();
  NoAutocastCache() { at::autocast::set_autocast_cache_enabled(false); }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(was); }
};

class CudaStepGraph : public StepGraph {
 public:
  CudaStepGraph(torch::Device device, const cuda::Runtime& runtime) : device_(device), graph_(runtime.make_graph()) {}

 protected:
  bool record(const std::function<void()>& run, const StepGraph* share_pool_with) override {
    // The caching allocator hands the graph a private pool; finish everything queued first.
    torch::cuda::synchronize(device_.index());
    NoAutocastCache no_cache;
    const auto* other = dynamic_cast<const CudaStepGraph*>(share_pool_with);
    auto fatal = [](const std::string& why) {
      return Error("cuda_graph: the training step could not be captured (" + why +
                   "); nothing of this step ran, but CUDA's capture state could not be closed cleanly, so the run "
                   "stops here. Run without /training/cuda_graph (the models or the objective may read the host "
                   "inside the step)");
    };
    try {
      graph_->capture_begin(other ? other->graph_.get() : nullptr);
    } catch (const std::exception& e) {
      throw fatal(message_of(e));  // it may have left the allocator or the RNG mid-capture
    }
    std::string failure;
    try {
      run();
    } catch (const std::exception& e) {
      failure = message_of(e);
    }
    // Always end the capture (as torch.cuda.graph's __exit__ does): it takes the stream out of
    // capture mode, gives the allocator's pool back and closes the RNG's capture.
    try {
      graph_->capture_end();
    } catch (const std::exception& e) {
      // An invalidated capture (a host read or another unsupported call inside it): CUDA and
      // the allocator are left mid-capture, and going on eagerly would not be safe.
      throw fatal(failure.empty() ? message_of(e) : failure);
    }
    if (!failure.empty()) {
      graph_.reset();  // the partial graph and its pool go; this StepGraph is not used again
      throw CaptureFailed(failure);
    }
    return false;
  }
  void launch() override { graph_->replay(); }

 private:
  torch::Device device_;
  std::unique_ptr<cuda::Graph> graph_;
};

}  // namespace

std::unique_ptr<StepGraph> make_cuda_step_graph(torch::Device device) {
  if (!device.is_cuda()) throw Error("cuda_graph: CUDA graphs need a CUDA device (this run is on " + device.str() + ")");
  const cuda::Runtime* runtime = cuda::runtime();
  if (!runtime) throw Error("cuda_graph: refit's CUDA support is " + cuda::support_status());
  return std::make_unique<CudaStepGraph>(device, *runtime);
}

struct SideStream::Impl {
  std::unique_ptr<cuda::StreamScope> scope;
  std::vector<torch::Tensor> adopted;
};

SideStream::SideStream(torch::Device device) : impl_(std::make_unique<Impl>()) {
  if (!device.is_cuda()) return;
  const cuda::Runtime* runtime = cuda::runtime();
  if (!runtime) throw Error("CUDA streams: refit's CUDA support is " + cuda::support_status());
  impl_->scope = runtime->stream_scope(device);
}

void SideStream::adopt(const std::vector<Batch>& window) {
  if (!impl_->scope) return;
  // One wait and one list for the window's batches (not one per micro-batch); the list's buffer
  // is kept from window to window.
  auto& tensors = impl_->adopted;
  // No reference to the batches' memory past the call, whether it returns or throws.
  struct Cleared {
    std::vector<torch::Tensor>& list;
    ~Cleared() { list.clear(); }
  } cleared{tensors};
  for (const auto& batch : window)
    for (const auto& kv : batch) tensors.push_back(kv.second);
  impl_->scope->adopt(tensors);
}

SideStream::~SideStream() = default;

}  // namespace refit
