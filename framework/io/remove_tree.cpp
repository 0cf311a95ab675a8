#include "io/remove_tree.h"

#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "io/fault.h"
#include "refit/error.h"

namespace refit::io {

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  const int r = std::remove(path);
  if (r == 0) fault_point("remove");
  return r;
}

/// The pid in a temporary entry's name (".<name>.tmp-<pid>" or ".<name>.tmp-<pid>-XXXXXX"), or 0.
long temporary_owner(const std::string& name) {
  if (name.empty() || name[0] != '.') return 0;
  const auto at = name.rfind(".tmp-");
  if (at == std::string::npos) return 0;
  std::size_t i = at + 5, end = i;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == i || end - i > 9 || (end != name.size() && name[end] != '-')) return 0;
  return std::stol(name.substr(i, end - i));
}

bool process_alive(long pid) { return pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }
}  // namespace

void remove_tree(const std::filesystem::path& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error("cannot remove " + path.string() + ": " + std::strerror(errno));
  }
  // Depth first, without following symlinks: children before their directory.
  if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    throw Error("cannot remove " + path.string() + ": " + std::strerror(errno));
}

void remove_tree_atomically(const std::filesystem::path& path) {
  const std::filesystem::path away = path.parent_path() / (".deleting-" + path.filename().string());
  remove_tree(away);  // what a kill left of an earlier delete of the same name
  if (::rename(path.c_str(), away.c_str()) != 0) {
    if (errno == ENOENT) return;
    throw Error("cannot move " + path.string() + " out of the way to delete it: " + std::strerror(errno));
  }
  fault_point("delete: rename away");
  remove_tree(away);
}

void remove_stale_entries(const std::filesystem::path& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(".deleting-", 0) == 0) {
      stale.push_back(name);
    } else if (const long pid = temporary_owner(name); pid > 0 && !process_alive(pid)) {
      stale.push_back(name);
    }
  }
  ::closedir(d);
  for (const auto& name : stale) remove_tree(dir / name);
}

}  // namespace refit::io
