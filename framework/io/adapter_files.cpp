#include "io/adapter_files.h"

#include <fstream>
#include <sstream>

#include "io/safetensors.h"
#include "refit/error.h"

namespace refit::io {

AdapterFiles read_adapter_files(const std::filesystem::path& dir) {
  AdapterFiles f;
  const auto weights = dir / "adapter_model.safetensors";
  const auto config = dir / "adapter_config.json";
  if (!std::filesystem::exists(weights)) throw Error("adapter folder " + dir.string() + " has no adapter_model.safetensors");
  f.tensors = SafetensorsFile::open(weights).load_all();
  std::ifstream in(config, std::ios::binary);
  if (!in) throw Error("adapter folder " + dir.string() + " has no adapter_config.json");
  std::stringstream text;
  text << in.rdbuf();
  // nlohmann takes a NUL byte for the end of the input; JSON text holds none.
  if (const auto at = text.str().find('\0'); at != std::string::npos)
    throw Error(config.string() + ": a NUL byte at offset " + std::to_string(at) + " (JSON text holds none: a damaged file?)");
  try {
    f.config = nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    throw Error(config.string() + ": invalid JSON: " + e.what());
  }
  return f;
}

void write_adapter_files(const std::filesystem::path& dir, const AdapterFiles& files) {
  save_safetensors(dir / "adapter_model.safetensors", files.tensors, {{"format", "pt"}});
  write_file_atomic(dir / "adapter_config.json", files.config.dump(2) + "\n");
}

}  // namespace refit::io
