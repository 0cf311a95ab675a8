// libFuzzer target: the GGUF reader (GgufFile::from_bytes, then every metadata accessor and every
// tensor read: dequantized to float32 and bf16 when refit reads its type, raw otherwise).
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "io/gguf.h"
#include "refit/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto buf = std::shared_ptr<std::uint8_t>(new std::uint8_t[size ? size : 1], std::default_delete<std::uint8_t[]>());
  if (size) std::memcpy(buf.get(), data, size);
  try {
    auto f = refit::io::GgufFile::from_bytes(buf, size, "fuzz");
    for (const auto& kv : f.metadata()) {
      const std::string& key = kv.first;  // not a structured binding: clang < 16 cannot capture one
      // Each accessor either returns or throws refit::Error for a value of another type.
      const auto each = [&](auto&& get) {
        try {
          (void)get();
        } catch (const refit::Error&) {
        }
      };
      each([&] { return f.get_string(key); });
      each([&] { return f.get_uint(key); });
      each([&] { return f.get_int(key); });
      each([&] { return f.get_float(key); });
      each([&] { return f.get_bool(key); });
      each([&] { return f.get_string_array(key); });
      each([&] { return f.get_int_array(key); });
      each([&] { return f.get_float_array(key); });
    }
    for (const auto& t : f.tensors()) {
      // The reader bounds every tensor by the input's size, so these buffers are at most a few
      // times the input (a Q4_0 block: 18 bytes -> 32 floats).
      if (!refit::io::gguf_can_dequantize(t.type)) {
        (void)f.read_raw(t.name);
        continue;
      }
      std::vector<float> out(static_cast<std::size_t>(t.numel()));
      f.dequantize(t.name, out.data());
      std::vector<std::uint16_t> out16(out.size());
      f.dequantize_bf16(t.name, out16.data());
    }
  } catch (const refit::Error&) {
  }
  return 0;
}
