// libFuzzer target: the safetensors reader (SafetensorsFile::from_bytes, then every tensor read).
#include <cstdint>
#include <cstring>
#include <memory>

#include "io/safetensors.h"
#include "refit/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto buf = std::shared_ptr<std::uint8_t>(new std::uint8_t[size ? size : 1], std::default_delete<std::uint8_t[]>());
  if (size) std::memcpy(buf.get(), data, size);
  try {
    auto f = refit::io::SafetensorsFile::from_bytes(buf, size, "fuzz");
    for (const auto& t : f.tensors()) (void)f.load(t.name);
  } catch (const refit::Error&) {
  }
  return 0;
}
