#pragma once
// Reading a file's bytes at an offset without a shared file position, for the file readers
// (safetensors.h, gguf.h): a descriptor read by several threads at once needs pread. No LibTorch.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace refit::io {

/// Reads exactly `n` bytes at `offset` into `buf`, retrying short reads and EINTR; false when the
/// file ends first. Throws refit::Error naming `label` on a read error.
bool pread_full(int fd, void* buf, std::size_t n, std::uint64_t offset, const std::string& label);

/// An open descriptor of the regular file `path` (closed when the last copy goes) and its size.
/// Throws refit::Error naming the path when it cannot be opened or is not a regular file.
struct ReadableFile {
  std::shared_ptr<const int> fd;
  std::size_t size = 0;
};
ReadableFile open_regular_file(const std::filesystem::path& path);

}  // namespace refit::io
