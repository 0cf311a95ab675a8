#pragma once
#include <filesystem>

namespace refit::io {

/// Removes a file or a directory tree; a missing path is not an error. Throws refit::Error.
///
/// Why not std::filesystem::remove_all: the PyPI LibTorch (libtorch.so, torch 2.11) exports its
/// own copies of several std::filesystem functions, and the dynamic linker binds refit's calls
/// to them; its remove_all jumps through a null pointer (SIGSEGV) on a non-empty directory.
void remove_tree(const std::filesystem::path& path);

}  // namespace refit::io
