#include "io/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "refit/error.h"

namespace refit::io {

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return std::remove(path); }
}  // namespace

void remove_tree(const std::filesystem::path& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error("cannot remove " + path.string() + ": " + std::strerror(errno));
  }
  // Depth first, without following symlinks: children before their directory.
  if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    throw Error("cannot remove " + path.string() + ": " + std::strerror(errno));
}

}  // namespace refit::io
