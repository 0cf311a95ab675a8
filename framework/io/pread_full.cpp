#include "io/pread_full.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "refit/error.h"

namespace refit::io {

bool pread_full(int fd, void* buf, std::size_t n, std::uint64_t offset, const std::string& label) {
  auto* p = static_cast<std::uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot read " + label + ": " + std::strerror(errno));
    }
    if (r == 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

ReadableFile open_regular_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open " + path.string() + ": " + std::strerror(errno));
  ReadableFile f;
  f.fd = std::shared_ptr<const int>(new int(fd), [](const int* p) {
    ::close(*p);
    delete p;
  });
  struct stat st {};
  if (fstat(fd, &st) != 0) throw Error("cannot stat " + path.string() + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error("cannot read " + path.string() + ": not a regular file");
  f.size = static_cast<std::size_t>(st.st_size);
  return f;
}

}  // namespace refit::io
