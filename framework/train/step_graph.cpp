#include "train/step_graph.h"

#include <optional>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

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

struct StepGraph::Impl {
  Impl(torch::Device d, bool emulate) : device(d) {
    if (!emulate) graph = std::make_unique<at::cuda::CUDAGraph>();
  }
  torch::Device device;
  std::unique_ptr<at::cuda::CUDAGraph> graph;  // none when emulating
  StepGraph::Step recorded;                    // emulation: the step, re-run at every replay
  bool captured = false;
  Batch input;             // the static batch the graph reads
  std::int64_t count = 0;  // the normaliser baked into the graph
  // The step's outputs, written by every replay: loss, grad norms and scales packed in one
  // float vector so that a replay's values come out in one copy.
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

  void run() {
    if (graph) {
      graph->replay();
    } else {
      StepResult r;
      recorded(input, r);
      pack(r);
    }
  }

  /// This replay's outputs, copied out of the graph's buffers (two copies, no host sync).
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

StepGraph::StepGraph(torch::Device device, bool emulate) {
  if (!device.is_cuda() && !emulate)
    throw Error("cuda_graph: CUDA graphs need a CUDA device (this run is on " + device.str() + ")");
  impl_ = std::make_unique<Impl>(device, emulate || !device.is_cuda());
}

StepGraph::~StepGraph() = default;

bool StepGraph::captured() const { return impl_->captured; }

bool StepGraph::fits(const Batch& batch, std::int64_t count) const {
  const Batch& s = impl_->input;
  if (count != impl_->count || !same_layout(batch.input, s.input) || !same_layout(batch.target, s.target) ||
      batch.views.size() != s.views.size() || batch.global_views != s.global_views)
    return false;
  for (std::size_t v = 0; v < s.views.size(); ++v)
    if (!same_layout(batch.views[v], s.views[v])) return false;
  return true;
}

StepResult StepGraph::capture(const Batch& batch, std::int64_t count, const Step& step, const StepGraph* share_pool_with) {
  Impl& m = *impl_;
  auto clone = [](const torch::Tensor& t) { return t.defined() ? t.clone() : t; };
  m.input = Batch{clone(batch.input), clone(batch.target), {}, batch.global_views};
  for (const auto& v : batch.views) m.input.views.push_back(v.clone());
  m.count = count;
  if (!m.graph) {  // emulation: remember the step; each replay runs it on the static batch
    m.recorded = step;
    try {
      m.run();
    } catch (const std::exception& e) {
      m.recorded = nullptr;
      throw CaptureFailed(e.what());
    }
    m.captured = true;
    return m.outputs();
  }
  // The caching allocator hands the graph a private pool; finish everything queued first.
  torch::cuda::synchronize(m.device.index());
  // Autocast's cast cache would hand the graph tensors allocated outside it (and keep graph
  // tensors alive outside): PyTorch requires it off while capturing.
  const bool cache = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(false);
  // Thread-local: the loader's worker threads may pin host memory (cudaHostAlloc) while the
  // capture runs, which global mode would refuse; kernels reach the capture by their stream,
  // so the autograd engine's device thread is captured either way.
  const c10::MempoolId_t pool =
      share_pool_with && share_pool_with->impl_->graph ? share_pool_with->impl_->graph->pool() : c10::MempoolId_t{0, 0};
  m.graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
  std::string failure;
  try {
    StepResult r;
    step(m.input, r);
    m.pack(r);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Always end the capture (as torch.cuda.graph's __exit__ does): it takes the stream out of
  // capture mode, gives the allocator's pool back and closes the RNG's capture.
  try {
    m.graph->capture_end();
  } catch (const std::exception& e) {
    at::autocast::set_autocast_cache_enabled(cache);
    // An invalidated capture (a host read or another unsupported call inside it): CUDA and the
    // allocator are left mid-capture, and going on eagerly would not be safe.
    throw Error("cuda_graph: the training step could not be captured (" + (failure.empty() ? e.what() : failure) +
                "); nothing of this step ran, but the capture could not be closed cleanly, so the run stops here. "
                "Run without /training/cuda_graph (the models or the objective read the host inside the step)");
  }
  at::autocast::set_autocast_cache_enabled(cache);
  if (!failure.empty()) {
    m.graph.reset();  // the partial graph and its pool go; this StepGraph is not used again
    throw CaptureFailed(failure);
  }
  m.captured = true;
  m.run();
  return m.outputs();
}

StepResult StepGraph::replay(const Batch& batch) {
  Impl& m = *impl_;
  copy_into(m.input.input, batch.input);
  copy_into(m.input.target, batch.target);
  for (std::size_t v = 0; v < batch.views.size(); ++v) copy_into(m.input.views[v], batch.views[v]);
  m.run();
  return m.outputs();
}

struct SideStream::Impl {
  std::optional<c10::cuda::CUDAStream> outer, side;
  cudaStream_t raw = nullptr;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

namespace {
// `waiter` runs nothing queued after this point until `done`'s work so far has finished.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiter);
}
}  // namespace

SideStream::SideStream(torch::Device device) : impl_(std::make_unique<Impl>()) {
  if (!device.is_cuda()) return;
  Impl& m = *impl_;
  m.outer = c10::cuda::getCurrentCUDAStream(device.index());
  // A stream of its own: a pool stream is shared round-robin with any other code in the process,
  // whose work would land in the capture.
  c10::cuda::CUDAGuard device_guard(m.outer->device_index());
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&m.raw, cudaStreamNonBlocking));
  m.side = c10::cuda::getStreamFromExternal(m.raw, m.outer->device_index());
  wait_for(*m.side, *m.outer);  // what the outer stream wrote (weights, state) comes first
  m.guard.emplace(*m.side);
}

void SideStream::wait_for_outer() {
  if (impl_->side) wait_for(*impl_->side, *impl_->outer);
}

SideStream::~SideStream() {
  Impl& m = *impl_;
  if (!m.outer) return;
  m.guard.reset();
  wait_for(*m.outer, *m.side);  // and the outer stream sees everything the side stream did
  // The stream is not destroyed: tensors allocated on it may outlive the run, and the caching
  // allocator keeps their blocks by stream (PyTorch never destroys its pool streams either).
}

}  // namespace refit
