#include "io/atomic_output.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/fault.h"
#include "refit/error.h"

namespace refit::io {

AtomicOutputFile::AtomicOutputFile(std::filesystem::path target) : target_(std::move(target)) {
  namespace fs = std::filesystem;
  const fs::path dir = target_.parent_path().empty() ? fs::path(".") : target_.parent_path();
  fs::create_directories(dir);
  // The pid in the name lets a later run tell a dead process's leftover (io::remove_stale_entries).
  std::string tmpl = (dir / ("." + target_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) throw Error("cannot create a temporary file next to " + target_.string() + ": " + std::strerror(errno));
  temporary_ = name.data();
  fault_point("write: create temporary");
  // mkstemp creates 0600; give the file the permissions an ordinary create would (0666 & ~umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  file_ = ::fdopen(fd, "w");
  if (!file_) {
    ::close(fd);
    ::unlink(temporary_.c_str());
    throw Error("cannot open " + temporary_ + ": " + std::strerror(errno));
  }
}

AtomicOutputFile::~AtomicOutputFile() {
  if (!file_) return;
  std::fclose(file_);
  ::unlink(temporary_.c_str());
}

void AtomicOutputFile::write(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size())
    throw Error("cannot write " + target_.string() + ": " + std::strerror(errno));
}

void AtomicOutputFile::commit() {
  std::FILE* f = file_;
  file_ = nullptr;
  auto fail = [&](const char* what, int e) {
    ::unlink(temporary_.c_str());
    throw Error(std::string(what) + target_.string() + ": " + std::strerror(e));
  };
  if (std::fflush(f) != 0) {
    const int e = errno;
    std::fclose(f);
    fail("cannot write ", e);
  }
  fault_point("write: data written");
  if (::fsync(::fileno(f)) != 0) {
    const int e = errno;
    std::fclose(f);
    fail("cannot flush ", e);
  }
  if (std::fclose(f) != 0) fail("cannot flush ", errno);
  // rename() is atomic within a file system: readers see the old file or the new one, never a part.
  if (std::rename(temporary_.c_str(), target_.c_str()) != 0) fail("cannot move the new file into place at ", errno);
  fault_point("write: rename into place");
  // The rename itself survives a power loss once the folder is synced.
  const std::filesystem::path dir = target_.parent_path().empty() ? std::filesystem::path(".") : target_.parent_path();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    // A point of its own, so that the kill test sees every rename followed by its folder sync.
    if (::fsync(dfd) == 0) fault_point("write: folder synced");
    ::close(dfd);
  }
}

}  // namespace refit::io
