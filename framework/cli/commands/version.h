#pragma once
// `refit --version`: what this binary was built with and what the machine offers.
#include <cstdio>

namespace refit::cli {

/// refit and plugin-API versions, LibTorch, CUDA, the malloc in use and the CPU bf16 route.
void version(std::FILE* out);

}  // namespace refit::cli
