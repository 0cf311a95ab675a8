// libFuzzer target: the ELF section reader (cuda/elf_section.h) that reads librefit_cuda.so's
// build text before the library is loaded. The input is a file's bytes. Whatever they are, the
// reader returns the section, nothing, or a refit::Error; a section it returns lies inside the
// input, within the size asked for.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cuda/elf_section.h"
#include "refit/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view image(reinterpret_cast<const char*>(data), size);
  for (const char* name : {".refit_cuda_build", ".shstrtab", ".text"}) {
    try {
      const auto section = refit::cuda::elf_section(image, name, 192, "fuzz input");
      if (section && (section->size() > 192 || (!section->empty() && image.find(*section) == std::string_view::npos)))
        std::abort();  // larger than asked, or bytes that are not the input's
    } catch (const refit::Error&) {
      // a clean refusal
    }
  }
  return 0;
}
