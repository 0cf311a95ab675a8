#pragma once
// Constructors of c10d backends, one translation unit each: ProcessGroupGloo.hpp needs Gloo's
// headers and ProcessGroupNCCL.hpp needs nccl.h (and libtorch_cuda: cuda/cuda_runtime.cpp), and
// neither should leak into the rest of refit.
#include <chrono>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace refit::distributed {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout);

/// Throws refit::Error without refit's CUDA support (cuda/cuda_support.h) or without NCCL in it.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout);

}  // namespace refit::distributed
