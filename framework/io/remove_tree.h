#pragma once
#include <filesystem>

namespace refit::io {

/// Removes a file or a directory tree; a missing path is not an error. Throws refit::Error.
///
/// Why not std::filesystem::remove_all: the PyPI LibTorch (libtorch.so, torch 2.11) exports its
/// own copies of several std::filesystem functions, and the dynamic linker binds refit's calls
/// to them; its remove_all jumps through a null pointer (SIGSEGV) on a non-empty directory.
void remove_tree(const std::filesystem::path& path);

/// Removes a directory tree so that a kill at any instant leaves it either complete or gone from
/// its name: renames `path` to `.deleting-<name>` beside it (one atomic step), then removes that.
/// A `.deleting-*` entry left by a kill is removed by remove_stale_entries(). A missing path is
/// not an error.
void remove_tree_atomically(const std::filesystem::path& path);

/// Removes, from `dir`, what a killed refit process left behind: `.deleting-*` trees, and the
/// temporary files and folders of processes no longer alive (`.<name>.tmp-<pid>` and
/// `.<name>.tmp-<pid>-XXXXXX`, as save_checkpoint and write_file_atomic name them). A missing
/// `dir` is not an error.
void remove_stale_entries(const std::filesystem::path& dir);

}  // namespace refit::io
