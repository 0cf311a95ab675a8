// refit's CUDA support (framework/cuda/cuda_support.h): LibTorch's CUDA half is in the process
// exactly when refit loaded it, as REFIT_CUDA and the machine's CUDA driver say; ctest runs this
// case as it is and under REFIT_CUDA=on and =off (tests/CMakeLists.txt).
#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <catch2/catch.hpp>

#include "cuda/cuda_support.h"
#include "refit/error.h"

// This file's helpers stay in a namespace of its own (unity batches: CONTRIBUTING.md).
namespace refit_test_cuda_support {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(library) != std::string::npos) return true;
  return false;
}

TEST_CASE("CUDA support: LibTorch's CUDA half is loaded exactly where REFIT_CUDA and the CUDA driver say") {
  const char* env = std::getenv("REFIT_CUDA");
  const std::string mode = env && *env ? env : "auto";
  const bool driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr;
  const bool expected = mode == "on" || (mode == "auto" && driver);
  INFO("REFIT_CUDA=" << mode << ", driver " << driver << ": " << refit::cuda::support_status());
  CHECK((refit::cuda::runtime() != nullptr) == expected);
  CHECK(mapped("/libtorch_cuda.so") == expected);
  // LibTorch's CUDA hooks are the real ones exactly when the CUDA half came before its first query.
  CHECK(at::detail::getCUDAHooks().isBuilt() == expected);
  CHECK(refit::cuda::support_status().rfind(expected ? "loaded (REFIT_CUDA=" + mode : "not loaded (REFIT_CUDA=" + mode, 0) ==
        0);
  if (refit::cuda::runtime() && !driver) {
    // Loaded on a machine without a GPU: LibTorch sees no device, and the CPU computes as before.
    CHECK(at::detail::getCUDAHooks().deviceCount() == 0);
  }
  CHECK(at::mm(at::ones({2, 3}), at::ones({3, 2})).sum().item<float>() == 12.0f);
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_CASE("CUDA support: librefit_cuda.so's build is read from its file before it is loaded, and other files are "
          "refused cleanly") {
  using refit::cuda::runtime_build_of;
  const std::string dir = (std::filesystem::temp_directory_path() / "refit-tests" / "cuda-build").string();
  std::filesystem::create_directories(dir);
  // Files that are no librefit_cuda.so: a clear refit::Error each, nothing loaded.
  CHECK_THROWS_WITH(runtime_build_of(dir + "/missing.so"), Catch::Contains("cannot read " + dir + "/missing.so"));
  write_bytes(dir + "/text.so", "not an ELF file");
  CHECK_THROWS_WITH(runtime_build_of(dir + "/text.so"), Catch::Contains("not a 64-bit little-endian ELF file"));
  CHECK_THROWS_WITH(runtime_build_of("/proc/self/exe"), Catch::Contains("no .refit_cuda_build section"));
  // Read whole before main, so bounded: a file far larger than the library is refused unread
  // (sparse: no disk used).
  { std::ofstream(dir + "/huge.so"); }
  std::filesystem::resize_file(dir + "/huge.so", (64u << 20) + 1);
  CHECK_THROWS_WITH(runtime_build_of(dir + "/huge.so"), Catch::Contains(dir + "/huge.so: 67108865 bytes"));
  std::filesystem::remove(dir + "/huge.so");

  // ctest names this build's librefit_cuda.so, or nothing where LibTorch has no CUDA half.
  const char* library = std::getenv("REFIT_CUDA_LIBRARY");
  INFO("REFIT_CUDA_LIBRARY is set by ctest (tests/CMakeLists.txt)");
  REQUIRE(library != nullptr);
  if (*library == 0) return;
  const std::string image = read_bytes(library);
  const std::string text = runtime_build_of(library);
  INFO(library << ": \"" << text << "\"");
  const std::string prefix = std::string("refit ") + refit::kVersion + ", LibTorch " + TORCH_VERSION + ", interface ";
  REQUIRE(text.rfind(prefix, 0) == 0);
  REQUIRE(text.size() == prefix.size() + 16);  // the header's hash
  for (std::size_t i = prefix.size(); i < text.size(); ++i) CHECK(std::isxdigit(static_cast<unsigned char>(text[i])));
  // Another build's library (its text changed in place): read as that build, which the loader skips.
  const std::size_t at = image.find(text);
  REQUIRE(at != std::string::npos);
  std::string other = image;
  other[at + prefix.size()] = other[at + prefix.size()] == '0' ? '1' : '0';
  write_bytes(dir + "/other.so", other);
  CHECK(runtime_build_of(dir + "/other.so") != text);
  CHECK(runtime_build_of(dir + "/other.so").size() == text.size());
  // Cut anywhere, the file is refused (the section headers are at its end) or still read right.
  for (const std::size_t size :
       {std::size_t{0}, std::size_t{4}, std::size_t{63}, std::size_t{64}, at, at + 5, image.size() / 2, image.size() - 1}) {
    write_bytes(dir + "/cut.so", image.substr(0, size));
    INFO("cut at " << size << " of " << image.size() << " bytes");
    CHECK_THROWS_AS(runtime_build_of(dir + "/cut.so"), refit::Error);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace refit_test_cuda_support
