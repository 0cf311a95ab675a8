#include "memory/process_malloc.h"

#include <dlfcn.h>

namespace refit {

std::string process_malloc() {
  // Each library exports an entry point of its own beside malloc; which one `malloc` resolves
  // to is the one whose library defines the symbol the dynamic linker found first.
  void* malloc_symbol = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info{};
  if (malloc_symbol && dladdr(malloc_symbol, &info) && info.dli_fname) {
    const std::string file = info.dli_fname;
    if (file.find("tcmalloc") != std::string::npos) return "tcmalloc";
    if (file.find("jemalloc") != std::string::npos) return "jemalloc";
  }
  return "glibc";
}

}  // namespace refit
