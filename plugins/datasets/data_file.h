#pragma once
// DataFile: reads a file that may be gzip-compressed (detected from its content, not its name)
// or plain, through zlib. Offsets count uncompressed bytes, so errors can name the record that
// is broken whatever the file's compression.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace refit::datasets {

class DataFile {
 public:
  /// Opens `path`; throws refit::Error naming the file when it cannot be opened.
  explicit DataFile(const std::filesystem::path& path);
  ~DataFile();
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  /// Reads up to `n` bytes into `dst`; fewer at the end of the data or when the compressed
  /// data is corrupt or truncated, which error() then describes.
  std::size_t read(void* dst, std::size_t n);
  /// Reads and discards the rest; returns how many bytes that was.
  std::uint64_t skip_to_end();
  /// "" after a clean end; else what went wrong ("corrupt or truncated gzip data (zlib: ...)").
  const std::string& error() const { return error_; }
  /// Uncompressed bytes read so far.
  std::uint64_t offset() const { return offset_; }
  bool compressed() const { return compressed_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void* file_ = nullptr;  // gzFile
  std::filesystem::path path_;
  std::uint64_t offset_ = 0;
  bool compressed_ = false;
  std::string error_;
};

/// The whole (uncompressed) content of a plain or gzipped file; throws refit::Error naming the
/// file and the offset when the compressed data is corrupt or truncated.
std::string read_data_file(const std::filesystem::path& path);

}  // namespace refit::datasets
