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
  std::ifstream in(config);
  if (!in) throw Error("adapter folder " + dir.string() + " has no adapter_config.json");
  try {
    f.config = nlohmann::json::parse(in);
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
