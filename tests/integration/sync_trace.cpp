// LD_PRELOAD library for tests/integration/renames_synced.py: logs, at the C library, every
// rename (rename, renameat, renameat2) and every fsync / fdatasync (with the path of the synced descriptor) that the process
// makes, one line each, to the file REFIT_SYNC_TRACE names. What refit's own fault points say
// about durability is checked here against the calls it really makes.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

template <class F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

std::string absolute(const char* path) {
  if (path[0] == '/') return path;
  char cwd[PATH_MAX];
  return std::string(getcwd(cwd, sizeof cwd) ? cwd : "?") + "/" + path;
}

std::string path_of(int fd) {
  char link[64], target[PATH_MAX];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  return n < 0 ? "?" : std::string(target, static_cast<std::size_t>(n));
}

// One write() per line on an O_APPEND descriptor: lines from several threads do not interleave.
void trace(const std::string& line) {
  static const int out = [] {
    const char* file = std::getenv("REFIT_SYNC_TRACE");
    return file ? open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
  }();
  if (out < 0) return;
  const std::string text = line + "\n";
  if (write(out, text.data(), text.size()) < 0) return;
}

// A path relative to a directory descriptor: absolute as it is, else joined to the descriptor's.
std::string absolute_at(int dirfd, const char* path) {
  if (path[0] == '/' || dirfd == AT_FDCWD) return absolute(path);
  return path_of(dirfd) + "/" + path;
}

}  // namespace

extern "C" {

int rename(const char* from, const char* to) {
  static const auto real = next<int (*)(const char*, const char*)>("rename");
  const int rc = real(from, to);
  if (rc == 0) trace("rename\t" + absolute(from) + "\t" + absolute(to));
  return rc;
}

int renameat(int olddirfd, const char* from, int newdirfd, const char* to) {
  static const auto real = next<int (*)(int, const char*, int, const char*)>("renameat");
  const int rc = real(olddirfd, from, newdirfd, to);
  if (rc == 0) trace("rename\t" + absolute_at(olddirfd, from) + "\t" + absolute_at(newdirfd, to));
  return rc;
}

int renameat2(int olddirfd, const char* from, int newdirfd, const char* to, unsigned int flags) {
  static const auto real = next<int (*)(int, const char*, int, const char*, unsigned int)>("renameat2");
  const int rc = real(olddirfd, from, newdirfd, to, flags);
  if (rc == 0) trace("rename\t" + absolute_at(olddirfd, from) + "\t" + absolute_at(newdirfd, to));
  return rc;
}

int fsync(int fd) {
  static const auto real = next<int (*)(int)>("fsync");
  const int rc = real(fd);
  if (rc == 0) trace("fsync\t" + path_of(fd));
  return rc;
}

int fdatasync(int fd) {
  static const auto real = next<int (*)(int)>("fdatasync");
  const int rc = real(fd);
  if (rc == 0) trace("fsync\t" + path_of(fd));
  return rc;
}

}  // extern "C"
