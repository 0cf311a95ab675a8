// libFuzzer target: the recipe reader, on the text `refit validate` and `refit train` read
// (load_recipe_text: NUL check, JSON parse, depth check, --set overrides, ${VAR} expansion, every
// key's typed read with JSON pointers and did-you-mean), then the issue list as the CLI prints it.
// Input: the recipe's text; after a first NUL byte (which no JSON text holds), NUL-separated
// `--set KEY=VALUE` overrides. A refit::Error is the reader's clean refusal; anything else that
// escapes (another exception, a crash, an ASan report) is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "core/recipe_parser.h"
#include "refit/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  std::vector<std::string> overrides;
  for (std::size_t at = nul; at != std::string::npos && at < input.size();) {
    const std::size_t next = input.find('\0', at + 1);
    overrides.push_back(input.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
    at = next;
  }
  try {
    refit::Recipe r = refit::load_recipe_text(text, "/fuzz/recipe.json", overrides);
    r.issues->throw_if_any();
  } catch (const refit::Error& e) {
    (void)std::string(e.what());
  }
  return 0;
}
