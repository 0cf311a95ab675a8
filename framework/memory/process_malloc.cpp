#include "memory/process_malloc.h"

#include <dlfcn.h>

namespace refit {

std::string process_malloc() {
  // `malloc` as the dynamic linker resolves it for the whole process, and the file defining it.
  void* malloc_symbol = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info{};
  if (!malloc_symbol || !dladdr(malloc_symbol, &info) || !info.dli_fname) return "unknown";
  std::string file = info.dli_fname;
  const auto slash = file.rfind('/');
  if (slash != std::string::npos) file = file.substr(slash + 1);
  if (file.rfind("libtcmalloc", 0) == 0) return "tcmalloc";
  if (file.rfind("libjemalloc", 0) == 0) return "jemalloc";
  if (file.rfind("libc.so", 0) == 0) return "glibc";
  return "other (" + file + ")";  // e.g. mimalloc preloaded, or a sanitizer's in the executable
}

}  // namespace refit
