#include "data_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <zlib.h>

#include "refit/error.h"

namespace refit::datasets {

namespace {
gzFile gz(void* f) { return static_cast<gzFile>(f); }
}  // namespace

DataFile::DataFile(const std::filesystem::path& path) : path_(path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    int e = errno;
    throw Error(path.string() + ": cannot open: " + (e ? std::strerror(e) : "out of memory"));
  }
  file_ = f;
  gzbuffer(f, 1 << 20);
  // gzdirect is only meaningful after the first read has looked at the header.
  unsigned char probe[2];
  std::FILE* raw = std::fopen(path.c_str(), "rb");
  if (raw) {
    compressed_ = std::fread(probe, 1, 2, raw) == 2 && probe[0] == 0x1f && probe[1] == 0x8b;
    std::fclose(raw);
  }
}

DataFile::~DataFile() {
  if (file_) gzclose(gz(file_));
}

std::size_t DataFile::read(void* dst, std::size_t n) {
  if (!error_.empty()) return 0;
  std::size_t total = 0;
  auto* out = static_cast<unsigned char*>(dst);
  while (total < n) {
    unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - total, 1u << 30));
    int got = gzread(gz(file_), out + total, chunk);
    if (got > 0) total += static_cast<std::size_t>(got);
    if (got == static_cast<int>(chunk)) continue;
    // A short read: the end of the data, or an error. (zlib records a truncated stream as soon
    // as it decompresses the last input into its buffer, so a full read can come with an error
    // pending; only a short read means the data really stopped there.)
    int err = Z_OK;
    const char* msg = gzerror(gz(file_), &err);
    if (got < 0 || (err != Z_OK && err != Z_STREAM_END)) {
      std::string m = msg && *msg ? msg : "unknown error";
      const std::string prefix = path_.string() + ": ";  // gzerror prefixes the path
      if (m.compare(0, prefix.size(), prefix) == 0) m = m.substr(prefix.size());
      error_ = std::string(compressed_ ? "corrupt or truncated gzip data" : "read error") + " (zlib: " + m + ")";
    }
    break;
  }
  offset_ += total;
  return total;
}

std::uint64_t DataFile::skip_to_end() {
  std::vector<unsigned char> buf(1 << 16);
  std::uint64_t skipped = 0;
  for (;;) {
    std::size_t got = read(buf.data(), buf.size());
    skipped += got;
    if (got < buf.size() || !error_.empty()) return skipped;
  }
}

std::string read_data_file(const std::filesystem::path& path) {
  DataFile f(path);
  std::string out;
  std::size_t used = 0;
  // A first guess of the size: the file's, or for gzip the trailer's ISIZE (the uncompressed
  // size mod 2^32), capped in case the trailer is garbage (a truncated file). Grows as needed.
  std::error_code ec;
  std::uint64_t guess = std::filesystem::file_size(path, ec);
  if (ec) guess = 1 << 20;
  if (!ec && f.compressed() && guess >= 18) {
    std::uint64_t isize = 0;
    if (std::FILE* raw = std::fopen(path.c_str(), "rb")) {
      unsigned char t[4];
      if (std::fseek(raw, -4, SEEK_END) == 0 && std::fread(t, 1, 4, raw) == 4)
        isize = t[0] | (std::uint64_t(t[1]) << 8) | (std::uint64_t(t[2]) << 16) | (std::uint64_t(t[3]) << 24);
      std::fclose(raw);
    }
    guess = std::max(guess, std::min(isize, guess * 16));
  }
  out.resize(static_cast<std::size_t>(guess + 1));
  for (;;) {
    if (used == out.size()) out.resize(out.size() * 2);
    std::size_t got = f.read(out.data() + used, out.size() - used);
    used += got;
    if (!f.error().empty())
      throw Error(path.string() + ": " + f.error() + " at uncompressed offset " + std::to_string(used));
    if (used < out.size()) break;
  }
  out.resize(used);
  return out;
}

}  // namespace refit::datasets
