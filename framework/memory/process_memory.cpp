#include "memory/process_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace refit {

std::int64_t peak_rss_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

std::optional<std::int64_t> resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return std::nullopt;
  return resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

namespace {

// A cgroup v2 limit less what the group already uses ("max": none).
std::optional<std::int64_t> cgroup_room() {
  std::ifstream max_in("/sys/fs/cgroup/memory.max"), cur_in("/sys/fs/cgroup/memory.current");
  std::string max;
  std::int64_t current = 0;
  if (!(max_in >> max) || max == "max" || !(cur_in >> current)) return std::nullopt;
  try {
    return std::max<std::int64_t>(0, std::stoll(max) - current);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<std::int64_t> available_bytes() {
  std::optional<std::int64_t> available;
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream fields(line.substr(13));
      std::int64_t kb = 0;
      if (fields >> kb) available = kb * 1024;
      break;
    }
  if (const auto room = cgroup_room(); room && (!available || *room < *available)) available = room;
  return available;
}

}  // namespace refit
