#include "memory/process_memory.h"

#include <sys/resource.h>

namespace refit {

std::int64_t peak_rss_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

}  // namespace refit
