#pragma once
// A file written in pieces that appears whole or not at all: the pieces go to a temporary file
// beside the target (`.<name>.tmp-<pid>-XXXXXX`, which io::remove_stale_entries recognises), and
// commit() flushes it, renames it into place and syncs the folder (write_file_atomic is this
// for one string; the kill tests step through its fault points). Destroyed without commit() (an exception, a
// failed input), the temporary is removed and the target left as it was.
#include <cstdio>
#include <filesystem>
#include <string>

namespace refit::io {

class AtomicOutputFile {
 public:
  explicit AtomicOutputFile(std::filesystem::path target);
  ~AtomicOutputFile();
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  void write(const std::string& text);
  /// fsync, close and rename over the target.
  void commit();
  const std::filesystem::path& target() const { return target_; }

 private:
  std::filesystem::path target_;
  std::string temporary_;
  std::FILE* file_ = nullptr;
};

}  // namespace refit::io
