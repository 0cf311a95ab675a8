#include "cuda/elf_section.h"

#include <elf.h>

#include <cstdint>
#include <cstring>

#include "refit/error.h"

namespace refit::cuda {

std::optional<std::string> elf_section(std::string_view image, const std::string& name, std::size_t max_size,
                                       const std::string& what) {
  const std::uint64_t size = image.size();
  // Bytes [offset, offset + count) of the image, bounds-checked (no sum that can wrap).
  auto at = [&](std::uint64_t offset, std::uint64_t count, const char* part) {
    if (offset > size || count > size - offset) throw Error(what + ": its " + part + " lies outside the file");
    return image.data() + offset;
  };
  Elf64_Ehdr header;
  if (size < sizeof header) throw Error(what + ": not a 64-bit little-endian ELF file (" + std::to_string(size) + " bytes)");
  std::memcpy(&header, image.data(), sizeof header);
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
      header.e_ident[EI_DATA] != ELFDATA2LSB)
    throw Error(what + ": not a 64-bit little-endian ELF file");
  if (header.e_shentsize != sizeof(Elf64_Shdr) || header.e_shnum == 0 || header.e_shstrndx >= header.e_shnum)
    throw Error(what + ": no section headers of the 64-bit ELF kind");
  const char* table = at(header.e_shoff, std::uint64_t{header.e_shnum} * sizeof(Elf64_Shdr), "section header table");
  auto section = [&](std::uint64_t i) {
    Elf64_Shdr h;
    std::memcpy(&h, table + i * sizeof h, sizeof h);
    return h;
  };
  const Elf64_Shdr names = section(header.e_shstrndx);
  const char* name_table = at(names.sh_offset, names.sh_size, "section name table");
  for (std::uint64_t i = 0; i < header.e_shnum; ++i) {
    const Elf64_Shdr h = section(i);
    // The name, NUL-terminated inside the name table.
    if (h.sh_name >= names.sh_size || names.sh_size - h.sh_name < name.size() + 1) continue;
    if (std::memcmp(name_table + h.sh_name, name.c_str(), name.size() + 1) != 0) continue;
    if (h.sh_type == SHT_NOBITS) return std::string();
    if (h.sh_size > max_size)
      throw Error(what + ": its " + name + " section holds more than " + std::to_string(max_size) + " bytes");
    return std::string(at(h.sh_offset, h.sh_size, "section"), h.sh_size);
  }
  return std::nullopt;
}

}  // namespace refit::cuda
