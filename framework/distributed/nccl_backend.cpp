// NCCL through LibTorch's ProcessGroupNCCL (libtorch_cuda.so), when refit is built against a
// LibTorch with CUDA and nccl.h is found (the nvidia-nccl wheel torch depends on ships it).
#include "distributed/backends.h"

#include "refit/error.h"

#ifdef REFIT_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace refit::distributed {

#ifdef REFIT_WITH_NCCL
bool nccl_built() { return true; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}
#else
bool nccl_built() { return false; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                    std::chrono::milliseconds) {
  throw Error("distributed: this refit was built without NCCL (LibTorch without CUDA, or nccl.h not found at "
              "configure time); use /training/distributed/backend \"gloo\"");
}
#endif

}  // namespace refit::distributed
