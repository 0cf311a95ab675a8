#pragma once

#include <filesystem>

namespace refit::install {

/// <libdir>/refit of the install the running executable belongs to (it sits in <bindir>): where an
/// installed refit keeps its plugins (plugins/) and its CUDA support (librefit_cuda.so), as
/// CMakeLists.txt installs them (libdir: lib, lib64, lib/<multiarch>). Found from /proc/self/exe
/// and <libdir>'s path relative to <bindir>, so a copied or relocated install finds its own;
/// empty where that link cannot be read.
std::filesystem::path library_dir();

}  // namespace refit::install
