// libFuzzer target: the bf16 per-shape decision store (precision/shape_routing.h,
// read_shape_store). The input is the file's bytes. Whatever they are, reading returns decisions
// or nothing (a damaged file is ignored); what it accepts must survive a write and a read back
// unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <unistd.h>

#include "precision/shape_routing.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/refit-fuzz-shape-store-" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  const auto read = refit::precision::read_shape_store(path);
  if (!read.empty()) {
    refit::precision::write_shape_store(path, read);
    const auto again = refit::precision::read_shape_store(path);
    if (again.size() != read.size()) std::abort();
    for (const auto& [name, d] : read) {
      const auto it = again.find(name);
      if (it == again.end() || it->second.fp32 != d.fp32 || it->second.native_given_up != d.native_given_up ||
          !(it->second.native_seconds == d.native_seconds || d.native_seconds != d.native_seconds) ||
          !(it->second.fp32_seconds == d.fp32_seconds || d.fp32_seconds != d.fp32_seconds))
        std::abort();  // a decision the store accepted did not round-trip
    }
  }
  std::remove(path.c_str());
  return 0;
}
