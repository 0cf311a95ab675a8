#pragma once
// Which malloc this process runs on: refit's executables link tcmalloc (or jemalloc) so that it
// replaces glibc's for LibTorch and the plugins too (CMakeLists.txt, REFIT_MALLOC). Reported by
// `refit --version` and at the end of `refit train`.
#include <string>

namespace refit {

/// "tcmalloc", "jemalloc", "glibc" or "other (<file>)": whose malloc the process's `malloc`
/// symbol resolves to.
std::string process_malloc();

}  // namespace refit
