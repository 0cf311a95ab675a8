// librefit_cuda.so: the refit functions that call CUDA directly (cuda/cuda_support.h says why
// they live apart). Linked against libtorch_cuda; loaded by refit_core, never linked by it.
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#ifdef REFIT_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "cuda/cuda_support.h"

namespace refit::cuda {
namespace {

class CudaGraph final : public Graph {
 public:
  void capture_begin(const Graph* share_pool_with) override {
    // Thread-local: the loader's worker threads may pin host memory (cudaHostAlloc) while the
    // capture runs, which global mode would refuse; kernels reach the capture by their stream,
    // so the autograd engine's device thread is captured either way.
    const auto* other = static_cast<const CudaGraph*>(share_pool_with);
    graph_.capture_begin(other ? other->graph_.pool() : c10::MempoolId_t{0, 0}, cudaStreamCaptureModeThreadLocal);
  }
  void capture_end() override { graph_.capture_end(); }
  void replay() override { graph_.replay(); }

 private:
  mutable at::cuda::CUDAGraph graph_;  // pool() is not const
};

// `waiter` runs nothing queued after this point until `done`'s work so far has finished.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiter);
}

/// One stream per device for the process's lifetime: a pool stream is shared round-robin with
/// any other code in the process (whose work would land in a capture), and a new stream per run
/// would leak (cuBLAS keeps a workspace per stream; the allocator caches blocks by stream).
c10::cuda::CUDAStream dedicated_stream(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device);
  if (it == streams.end()) {
    c10::cuda::CUDAGuard device_guard(device);
    cudaStream_t raw = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
    it = streams.emplace(device, raw).first;
  }
  return c10::cuda::getStreamFromExternal(it->second, device);
}

class SideStreamScope final : public StreamScope {
 public:
  explicit SideStreamScope(torch::Device device) {
    const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
    outer_ = c10::cuda::getCurrentCUDAStream(index);
    side_ = dedicated_stream(index);
    wait_for(*side_, *outer_);  // what the outer stream wrote (weights, state) comes first
    // Makes the run's device current as well (capture_begin and every op without a device
    // argument use the current device's current stream) until the destructor restores both.
    guard_.emplace(*side_);
  }
  ~SideStreamScope() override {
    guard_.reset();
    wait_for(*outer_, *side_);  // and the outer stream sees everything the side stream did
  }
  void adopt(const std::vector<torch::Tensor>& tensors) override {
    // Batches a dataset produced on the device (on a loader thread, on the default stream): this
    // stream waits for them, and the allocator learns that this stream uses their memory (else
    // it could hand it back to a loader thread while this stream still reads it).
    wait_for(*side_, *outer_);
    for (const auto& t : tensors)
      if (t.defined() && t.is_cuda()) t.record_stream(*side_);
  }

 private:
  std::optional<c10::cuda::CUDAStream> outer_, side_;
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
};

class CudaRuntime final : public Runtime {
 public:
  std::unique_ptr<Graph> make_graph() const override { return std::make_unique<CudaGraph>(); }
  std::unique_ptr<StreamScope> stream_scope(torch::Device device) const override {
    return std::make_unique<SideStreamScope>(device);
  }
  AllocatorStats allocator_stats(c10::DeviceIndex device) const override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return {stats.allocated_bytes[all].current, stats.allocated_bytes[all].peak, stats.reserved_bytes[all].current};
  }
  void reset_peak(c10::DeviceIndex device) const override { c10::cuda::CUDACachingAllocator::resetPeakStats(device); }
#ifdef REFIT_WITH_NCCL
  bool has_nccl() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                      std::chrono::milliseconds timeout) const override {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  }
#else
  bool has_nccl() const override { return false; }
  c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                      std::chrono::milliseconds) const override {
    throw std::runtime_error("NCCL: nccl.h was not found when librefit_cuda.so was built");
  }
#endif
};

}  // namespace
}  // namespace refit::cuda

// This build's text, in a section of its own, where the loader reads it before loading the file.
static_assert(std::string_view(refit::cuda::kRuntimeBuildSection) == ".refit_cuda_build");
extern "C" __attribute__((used, section(".refit_cuda_build"))) constexpr refit::cuda::RuntimeBuild refit_cuda_build =
    refit::cuda::runtime_build(REFIT_CUDA_INTERFACE);
static_assert(refit_cuda_build.text[sizeof refit_cuda_build.text - 2] == 0,
              "the build text fills RuntimeBuild: its end (the hash) is cut");

extern "C" __attribute__((visibility("default"))) const refit::cuda::Runtime* refit_cuda_runtime_v1(
    const char* loader_build) {
  if (loader_build == nullptr || std::string(refit_cuda_build.text) != loader_build) return nullptr;
  static const refit::cuda::CudaRuntime runtime;
  return &runtime;
}
