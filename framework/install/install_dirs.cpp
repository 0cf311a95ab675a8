#include "install/install_dirs.h"

#include <system_error>

namespace refit::install {

std::filesystem::path library_dir() {
  std::error_code ec;  // no exception: the CUDA support calls this before main
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return (exe.parent_path() / REFIT_LIBDIR_FROM_BINDIR / "refit").lexically_normal();
}

}  // namespace refit::install
