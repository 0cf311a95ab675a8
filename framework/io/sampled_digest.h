#pragma once
// A weights file's digest that costs O(tensors), not O(bytes), for the frozen base's fingerprint
// (train/checkpoint.h): the file's size, its whole header (every tensor's name, dtype, shape and
// offset, and the metadata), and three 64-byte windows of every tensor's bytes (its first, middle
// and last). Another set of weights for the same architecture (another fine-tune, another
// quantization, another export of it, a file truncated or padded) differs in the header or in
// windows of every tensor; what it cannot see is an edit confined to a tensor's interior,
// outside its windows (docs/training-loop.md, "Checkpoints and resume", says so). Reading a 2 GB base this way takes a few
// hundred small reads instead of 2 GB. No LibTorch: the GGUF reader links this alone.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace refit::io {

/// 64-bit FNV-1a: a fingerprint, not a defence against a chosen collision.
class Fnv1a64 {
 public:
  void add(const void* data, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 0x100000001b3ULL;
  }
  void add(const std::string& s) { add(s.data(), s.size()); }
  void add_u64(std::uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));  // the same on every host
    add(b, 8);
  }
  std::string hex() const {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
    return buf;
  }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

/// Bytes [begin, end) of a file (absolute offsets).
struct ByteRange {
  std::uint64_t begin = 0, end = 0;
};

/// The digest described above, of a file of `file_size` bytes whose header ends at `header_end`
/// and whose tensors lie at `tensors` (checked by the file's reader to lie inside it).
/// `read(offset, n, out)` reads `n` bytes at absolute `offset`.
template <typename Read>
std::string sampled_file_digest(std::uint64_t file_size, std::uint64_t header_end, const std::vector<ByteRange>& tensors,
                                Read&& read) {
  constexpr std::uint64_t kWindow = 64;
  Fnv1a64 h;
  h.add_u64(file_size);
  std::vector<unsigned char> buf(static_cast<std::size_t>(std::max<std::uint64_t>(header_end, kWindow)));
  read(0, header_end, buf.data());
  h.add(buf.data(), static_cast<std::size_t>(header_end));
  for (const ByteRange& t : tensors) {
    const std::uint64_t n = t.end - t.begin;
    h.add_u64(t.begin);
    h.add_u64(n);
    const std::uint64_t w = std::min(n, kWindow);
    for (const std::uint64_t at : {t.begin, t.begin + (n - w) / 2, t.end - w}) {
      read(at, w, buf.data());
      h.add(buf.data(), static_cast<std::size_t>(w));
    }
  }
  return h.hex();
}

}  // namespace refit::io
