#pragma once
// LibTorch's CUDA half, loaded only where it can be used.
//
// The wheel's libtorch_cuda.so brings cuBLAS, cuDNN, cuFFT, cuSPARSE, NCCL and NVSHMEM with it:
// linked into every process, it maps about 350 MB and adds about 0.13 s of start-up (its kernels
// register with the dispatcher) to each `refit` run and each test process, on machines that have
// no GPU at all. So no refit executable or plugin links it. refit_core loads it at start-up,
// before main (LibTorch decides once, at its first CUDA query, whether CUDA is there), together
// with librefit_cuda.so: the few refit functions that call CUDA directly (graphs, streams, the
// caching allocator's statistics, NCCL process groups), which link against libtorch_cuda.
//
// When: REFIT_CUDA=auto (the default) loads it where a CUDA driver is (libcuda.so.1 opens),
// REFIT_CUDA=on always, REFIT_CUDA=off never. Without it LibTorch answers "no CUDA device"
// everywhere, and refit runs on the CPU.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "refit/version.h"

namespace refit::cuda {

/// A CUDA graph (at::cuda::CUDAGraph).
class Graph {
 public:
  virtual ~Graph() = default;
  /// Starts capturing the current stream in thread-local mode, in `share_pool_with`'s memory pool
  /// (a graph of this runtime) or a new private one.
  virtual void capture_begin(const Graph* share_pool_with) = 0;
  virtual void capture_end() = 0;
  virtual void replay() = 0;
};

/// The device's work on a stream of refit's own until destroyed (train/step_graph.h: SideStream).
class StreamScope {
 public:
  virtual ~StreamScope() = default;
  /// The stream waits for the work queued on the outer stream so far, and `tensors`' CUDA memory
  /// is marked as used by it.
  virtual void adopt(const std::vector<torch::Tensor>& tensors) = 0;
};

/// The CUDA caching allocator's counters (bytes).
struct AllocatorStats {
  std::int64_t allocated = 0, peak_allocated = 0, reserved = 0;
};

/// What librefit_cuda.so implements. Errors are thrown as std::exception (c10::Error).
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual std::unique_ptr<Graph> make_graph() const = 0;
  virtual std::unique_ptr<StreamScope> stream_scope(torch::Device device) const = 0;
  virtual AllocatorStats allocator_stats(c10::DeviceIndex device) const = 0;
  virtual void reset_peak(c10::DeviceIndex device) const = 0;
  /// False where this LibTorch was built without NCCL (make_nccl_backend throws).
  virtual bool has_nccl() const = 0;
  virtual c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                              int size, std::chrono::milliseconds timeout) const = 0;
};

/// The build librefit_cuda.so and its loader must share, as text: refit's and LibTorch's versions
/// and `interface`, the hash of this header (REFIT_CUDA_INTERFACE: CMake computes it for the two
/// units that use it), since Runtime's layout is this header's. The library carries it in its
/// ELF section kRuntimeBuildSection, and the loader reads that from the file first: a library of
/// another build (a stale install) is skipped without being loaded, where loading it would map
/// libtorch_cuda.so and run its initialisers before its entry could refuse.
struct RuntimeBuild {
  char text[192];
};
constexpr RuntimeBuild runtime_build(const char* interface) {
  RuntimeBuild b{};
  std::size_t n = 0;
  for (const char* part : {"refit ", kVersion, ", LibTorch ", TORCH_VERSION, ", interface ", interface})
    for (; *part != 0 && n + 1 < sizeof b.text; ++part) b.text[n++] = *part;
  return b;
}
constexpr const char* kRuntimeBuildSection = ".refit_cuda_build";

/// The build text in `file`'s kRuntimeBuildSection, read without loading it; refit::Error when the
/// file cannot be read, is not a 64-bit little-endian ELF file or has no such section.
std::string runtime_build_of(const std::string& file);

/// librefit_cuda.so's one entry point, versioned: given the loader's build text, it returns its
/// Runtime (static storage), or null when its own differs (a second check, after the section's).
constexpr const char* kRuntimeEntry = "refit_cuda_runtime_v1";
using RuntimeEntry = const Runtime* (*)(const char* loader_build);

/// The loaded runtime, or null where CUDA support is not loaded (see above).
const Runtime* runtime();
/// Whether libtorch_cuda.so is loaded into this process, and why (or why not), in words:
/// "loaded (REFIT_CUDA=auto: a CUDA driver is installed)", "not loaded (REFIT_CUDA=auto: no
/// CUDA driver, libcuda.so.1 not found; REFIT_CUDA=on loads it)", or the loader's error.
const std::string& support_status();
/// The CUDA runtime version LibTorch's CUDA half was built with ("12.8"), or "" where that half is
/// not loaded (`refit --version`, summary.json's cuda_runtime).
std::string cudart_version();
/// Throws refit::Error when REFIT_CUDA is not auto, on or off, or is on and the support did not
/// load (the CLI checks this first: a setting that cannot be honoured is an error).
void check_support_setting();

}  // namespace refit::cuda
