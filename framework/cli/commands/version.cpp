#include "cli/commands/version.h"

#include <torch/cuda.h>

#include "core/plugin_loader.h"
#include "cuda/cuda_support.h"
#include "memory/process_malloc.h"
#include "precision/bf16_products.h"
#include "refit/version.h"

namespace refit::cli {

void version(std::FILE* out) {
  std::fprintf(out, "refit %s (plugin API %u)\nLibTorch %s, C++11 ABI %d\n", kVersion, kPluginApiVersion,
               host_torch_version().c_str(), host_cxx11_abi());
  std::fprintf(out, "CUDA support: %s\n", cuda::support_status().c_str());
  if (const std::string cudart = cuda::cudart_version(); !cudart.empty())
    std::fprintf(out, "CUDA runtime (LibTorch build) %s, ", cudart.c_str());
  std::fprintf(out, "CUDA devices: %zu\n", static_cast<std::size_t>(torch::cuda::device_count()));
  std::fprintf(out, "malloc: %s\n", process_malloc().c_str());
  std::fprintf(out, "CPU bf16 products: %s\n", precision::configure_bf16_products().describe().c_str());
}

}  // namespace refit::cli
