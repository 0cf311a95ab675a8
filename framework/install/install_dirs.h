#pragma once

#include <filesystem>

namespace refit::install {

/// <prefix>/<libdir>/refit for the running executable at <prefix>/bin: where an installed refit
/// keeps its plugins (plugins/) and its CUDA support (librefit_cuda.so), as CMakeLists.txt
/// installs them (libdir: lib, lib64, lib/<multiarch>). Read from /proc/self/exe, so a copied or
/// relocated install finds its own; empty where that link cannot be read.
std::filesystem::path library_dir();

}  // namespace refit::install
