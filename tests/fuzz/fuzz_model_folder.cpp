// libFuzzer target: the settings a sentence-transformers model folder declares
// (text/declared_pooling.h, text/declared_max_length.h). The input is up to four files separated
// by NUL bytes: modules.json, 1_Pooling/config.json, sentence_bert_config.json and
// tokenizer_config.json (a missing part: no such file). They are written into a folder of their
// own and read as `bert` reads them. A malformed file must be a std::runtime_error naming it; an
// accepted one must declare a pooling refit computes and a length in [3, 2^20].
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "text/declared_max_length.h"
#include "text/declared_pooling.h"

namespace {

const std::filesystem::path& folder() {
  // Never destroyed, so that the exit handler below may still name it.
  static const auto* dir = [] {
    auto* d = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                        ("refit-fuzz-model-folder-" + std::to_string(::getpid())));
    std::filesystem::create_directories(*d / "1_Pooling");
    std::atexit([] {  // libFuzzer ends a timed run with exit(): leave no folder behind
      std::error_code ec;
      std::filesystem::remove_all(folder(), ec);
    });
    return d;
  }();
  return *dir;
}

void write_or_remove(const std::filesystem::path& file, const std::string_view* bytes) {
  std::error_code ec;
  std::filesystem::remove(file, ec);
  if (!bytes) return;
  std::ofstream out(file, std::ios::binary);
  out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() < 4 && !rest.empty()) {
    const std::size_t nul = rest.find('\0');
    parts.push_back(rest.substr(0, nul));
    rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  }
  const char* names[] = {"modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "tokenizer_config.json"};
  for (std::size_t i = 0; i < 4; ++i) write_or_remove(folder() / names[i], i < parts.size() ? &parts[i] : nullptr);

  for (bool need_output : {true, false}) {
    try {
      const auto declared = refit::text::declared_pooling(folder(), 384, need_output);
      if (declared.output && *declared.output != "mean" && *declared.output != "cls" && *declared.output != "max")
        std::abort();                                     // a pooling refit does not compute was accepted
      if (declared.output && !need_output) std::abort();  // read without being asked for
    } catch (const std::runtime_error&) {
    }
  }
  try {
    const auto length = refit::text::declared_max_length(folder());
    if (length && (length->tokens < 3 || length->tokens > (1 << 20))) std::abort();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
