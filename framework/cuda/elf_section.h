#pragma once
// One section of an ELF file, read from its bytes without loading it: the build text that
// librefit_cuda.so carries (cuda_support.h, RuntimeBuild). No LibTorch.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace refit::cuda {

/// The contents of section `name` of the 64-bit little-endian ELF image `image` (a file's bytes),
/// or nullopt when it has no such section ("" for a section without bytes in the file,
/// SHT_NOBITS). refit::Error "<what>: ..." when the image is not such a file (extended section
/// numbering, for 65280 sections or more, included), when a header, the section names or the
/// section lie outside it, or when the section holds more than `max_size` bytes.
std::optional<std::string> elf_section(std::string_view image, const std::string& name, std::size_t max_size,
                                       const std::string& what);

}  // namespace refit::cuda
