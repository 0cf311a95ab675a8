// refit's CUDA support (framework/cuda/cuda_support.h): LibTorch's CUDA half is in the process
// exactly when refit loaded it, as REFIT_CUDA and the machine's CUDA driver say; ctest runs this
// case as it is and under REFIT_CUDA=on and =off (tests/CMakeLists.txt).
#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <catch2/catch.hpp>

#include "cuda/cuda_support.h"

// This file's helpers stay in a namespace of its own (unity batches: CONTRIBUTING.md).
namespace refit_test_cuda_support {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(library) != std::string::npos) return true;
  return false;
}

TEST_CASE("CUDA support: LibTorch's CUDA half is loaded exactly where REFIT_CUDA and the CUDA driver say") {
  const char* env = std::getenv("REFIT_CUDA");
  const std::string mode = env && *env ? env : "auto";
  const bool driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr;
  const bool expected = mode == "on" || (mode == "auto" && driver);
  INFO("REFIT_CUDA=" << mode << ", driver " << driver << ": " << refit::cuda::support_status());
  CHECK((refit::cuda::runtime() != nullptr) == expected);
  CHECK(mapped("/libtorch_cuda.so") == expected);
  // LibTorch's CUDA hooks are the real ones exactly when the CUDA half came before its first query.
  CHECK(at::detail::getCUDAHooks().isBuilt() == expected);
  CHECK(refit::cuda::support_status().rfind(expected ? "loaded (REFIT_CUDA=" + mode : "not loaded (REFIT_CUDA=" + mode, 0) ==
        0);
  if (refit::cuda::runtime() && !driver) {
    // Loaded on a machine without a GPU: LibTorch sees no device, and the CPU computes as before.
    CHECK(at::detail::getCUDAHooks().deviceCount() == 0);
  }
  CHECK(at::mm(at::ones({2, 3}), at::ones({3, 2})).sum().item<float>() == 12.0f);
}

}  // namespace refit_test_cuda_support
