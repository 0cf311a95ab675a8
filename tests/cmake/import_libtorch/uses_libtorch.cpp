// Built against refit's LibTorch import: ATen's CPU ops and its CUDA headers (which include the
// CUDA runtime's) compile, link and run; the CUDA hooks load without a GPU.
#include <ATen/ATen.h>
// Every CUDA header refit's sources include (ATen's CUDAEvent.h includes cuda_runtime.h, which
// needs the crt/ headers of nvidia-cuda-crt).
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include <cstdio>

int main() {
  at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  const float sum = at::mm(a, a.t()).sum().item<float>();  // [[5,14],[14,50]]
  std::printf("mm sum %.0f, cuda devices %d\n", sum, static_cast<int>(torch::cuda::device_count()));
  return sum == 83.0f ? 0 : 1;
}
