// NCCL through LibTorch's ProcessGroupNCCL, which lives in libtorch_cuda.so: refit's CUDA support
// (cuda/cuda_support.h) creates it where that is loaded.
#include "cuda/cuda_support.h"
#include "distributed/backends.h"
#include "refit/error.h"

namespace refit::distributed {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  const cuda::Runtime* runtime = cuda::runtime();
  if (!runtime || !runtime->has_nccl())
    throw Error("distributed: NCCL needs refit's CUDA support with NCCL, which is " +
                (runtime ? std::string("built without NCCL (nccl.h not found at configure time)") : cuda::support_status()) +
                "; use /training/distributed/backend \"gloo\"");
  return runtime->make_nccl_backend(store, rank, size, timeout);
}

}  // namespace refit::distributed
