#pragma once
// CRC-32 (zlib's: reflected polynomial 0xEDB88320), the checksum tests/golden/make_gguf.py takes of
// dequantized tensors with zlib.crc32. Slicing-by-8, so that a test can check all of SmolLM2's
// ~800 MB of dequantized values in about a second. Header-only and LibTorch-free.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace refit::test {

inline const std::array<std::array<std::uint32_t, 256>, 8>& crc32_tables() {
  static const auto tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
  }();
  return tables;
}

/// Continues a CRC-32 (start with 0) over `n` bytes, as zlib.crc32(data, crc).
inline std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) {
  const auto& t = crc32_tables();
  const auto* p = static_cast<const std::uint8_t*>(data);
  crc = ~crc;
  while (n >= 8) {
    std::uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][hi & 0xFF] ^
          t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

inline std::uint32_t crc32(const void* data, std::size_t n) { return crc32_update(0, data, n); }

}  // namespace refit::test
