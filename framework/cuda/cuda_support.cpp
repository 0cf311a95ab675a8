#include "cuda/cuda_support.h"

#include <dlfcn.h>

#include <ATen/detail/CUDAHooksInterface.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cuda/elf_section.h"
#include "install/install_dirs.h"
#include "refit/error.h"

namespace fs = std::filesystem;

namespace refit::cuda {
namespace {

struct Support {
  const Runtime* runtime = nullptr;
  std::string status = "not loaded (refit's start-up did not run)";
  bool failed = false;  // REFIT_CUDA is not a mode, or REFIT_CUDA=on could not load
};

Support& support() {
  static Support s;
  return s;
}

std::string last_dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

/// Where librefit_cuda.so is: installed beside the plugins (<prefix>/<libdir>/refit), else the
/// build tree's (an absolute path in a compile definition defeats ccache across clones: only
/// this unit gets it).
std::vector<fs::path> runtime_files() {
  std::vector<fs::path> files;
  if (const fs::path installed = install::library_dir(); !installed.empty()) files.push_back(installed / "librefit_cuda.so");
#ifdef REFIT_BUILD_CUDA_RUNTIME
  files.emplace_back(REFIT_BUILD_CUDA_RUNTIME);
#endif
  return files;
}

constexpr RuntimeBuild kBuild = runtime_build(REFIT_CUDA_INTERFACE);
static_assert(kBuild.text[sizeof kBuild.text - 2] == 0, "the build text fills RuntimeBuild: its end (the hash) is cut");

void load(Support& s) {
  const char* env = std::getenv("REFIT_CUDA");
  const std::string mode = env && *env ? env : "auto";
  const std::string why = "REFIT_CUDA=" + mode;
  if (mode == "off") {
    s.status = "not loaded (" + why + ")";
    return;
  }
  if (mode != "auto" && mode != "on") {
    s.status = "not loaded (" + why + ": expected auto, on or off)";
    s.failed = true;
    return;
  }
  // The driver stays open: libtorch_cuda's runtime opens it again.
  if (mode == "auto" && !dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    s.status = "not loaded (" + why + ": no CUDA driver, libcuda.so.1 not found; REFIT_CUDA=on loads it)";
    return;
  }
  s.failed = mode == "on";  // until it loads
  std::string looked;
  auto note = [&](const std::string& what) { looked += (looked.empty() ? "" : "; ") + what; };
  auto skip = [&](const fs::path& file, const std::string& because) {
    note(file.string() + (because.empty() ? "" : ": " + because));
  };
  for (const auto& file : runtime_files()) {
    std::error_code ec;  // no exception before main: an unreadable folder is one more place looked at
    if (!fs::is_regular_file(file, ec)) {
      skip(file, ec ? ec.message() : "");
      continue;
    }
    // Another build's library is skipped before it is loaded (cuda_support.h, RuntimeBuild).
    std::string build;
    try {
      build = runtime_build_of(file.string());
    } catch (const std::exception& e) {
      note(e.what());  // it names the file
      continue;
    }
    if (build != kBuild.text) {
      skip(file, "built as \"" + build + "\"");
      continue;
    }
    // Loading it loads libtorch_cuda.so, whose static initialisers register CUDA with LibTorch.
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      skip(file, last_dl_error());
      continue;
    }
    auto entry = reinterpret_cast<RuntimeEntry>(dlsym(handle, kRuntimeEntry));
    s.runtime = entry ? entry(kBuild.text) : nullptr;
    if (!s.runtime) {
      // Left loaded: its libtorch_cuda.so has registered CUDA with LibTorch, and dlclose could
      // unmap code those registries point at. (Its build text matched: this is a broken file.)
      skip(file, entry ? std::string("its entry refused this build") : std::string("no ") + kRuntimeEntry);
      continue;
    }
    s.failed = false;
    s.status = "loaded (" + why + (mode == "auto" ? ": a CUDA driver is installed)" : ")");
    return;
  }
  s.status = "not loaded (" + why + "): no librefit_cuda.so of this build (" + kBuild.text + "; looked at " + looked + ")";
}

}  // namespace

const Runtime* runtime() { return support().runtime; }

const std::string& support_status() { return support().status; }

std::string runtime_build_of(const std::string& file) {
  // Read whole before main, so bounded: librefit_cuda.so is about 100 KB (it links LibTorch's CUDA
  // half, never copies it); anything far larger at that place is not one.
  constexpr std::uintmax_t kMaxImage = 64u << 20;
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(file, ec);
  if (ec) throw Error("cannot read " + file + ": " + ec.message());
  if (size > kMaxImage)
    throw Error(file + ": " + std::to_string(size) + " bytes, more than a librefit_cuda.so (at most 64 MiB)");
  std::string image(static_cast<std::size_t>(size), '\0');
  std::ifstream in(file, std::ios::binary);
  in.read(image.data(), static_cast<std::streamsize>(image.size()));
  if (!in) throw Error("cannot read " + file);
  const auto text = elf_section(image, kRuntimeBuildSection, sizeof(RuntimeBuild), file);
  if (!text)
    throw Error(file + ": no " + kRuntimeBuildSection + " section (not a librefit_cuda.so of refit 0.6.0 or later)");
  return text->substr(0, text->find('\0'));
}

std::string cudart_version() {
  const auto& hooks = at::detail::getCUDAHooks();
  if (!hooks.isBuilt()) return "";
  const long v = hooks.versionCUDART();  // 12080 for 12.8
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

void check_support_setting() {
  if (support().failed) throw Error("refit's CUDA support: " + support().status);
}

}  // namespace refit::cuda

// Before main and before the executable's other static initialisers (priority 101, the first
// after the reserved ones): LibTorch caches its CUDA hooks at its first CUDA query. Every
// executable that links refit_core keeps this unit (refit_core's link options name this symbol).
extern "C" __attribute__((constructor(101))) void refit_cuda_support_at_start() {
  auto& s = refit::cuda::support();
  // An exception here, before main, would end the process: it becomes the status instead.
  try {
    refit::cuda::load(s);
  } catch (const std::exception& e) {
    s.runtime = nullptr;
    s.status = std::string("not loaded (") + e.what() + ")";
    s.failed = true;
  } catch (...) {
    s.runtime = nullptr;
    s.status = "not loaded (an unknown error)";
    s.failed = true;
  }
}
