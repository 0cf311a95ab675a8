#include "io/adapter_files.h"

#include <fstream>
#include <sstream>

#include "io/safetensors.h"
#include "refit/error.h"

namespace refit::io {

namespace {

nlohmann::json parse_config(const std::string& text, const std::filesystem::path& config) {
  // nlohmann takes a NUL byte for the end of the input; JSON text holds none.
  if (const auto at = text.find('\0'); at != std::string::npos)
    throw Error(config.string() + ": a NUL byte at offset " + std::to_string(at) +
                " (JSON text holds none: a damaged file?)");
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw Error(config.string() + ": invalid JSON: " + e.what());
  }
  // An adapter's checks look keys up: in anything but an object every key would seem absent.
  if (!c.is_object()) throw Error(config.string() + ": not a JSON object (a damaged file?)");
  return c;
}

}  // namespace

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
  f.config = parse_config(text.str(), config);
  return f;
}

AdapterFiles adapter_files_from_bytes(std::shared_ptr<const std::uint8_t> weights, std::size_t weights_size,
                                      const std::string& config_text, const std::filesystem::path& dir) {
  AdapterFiles f;
  f.tensors =
      SafetensorsFile::from_bytes(std::move(weights), weights_size, (dir / "adapter_model.safetensors").string()).load_all();
  f.config = parse_config(config_text, dir / "adapter_config.json");
  return f;
}

void write_adapter_files(const std::filesystem::path& dir, const AdapterFiles& files) {
  save_safetensors(dir / "adapter_model.safetensors", files.tensors, {{"format", "pt"}});
  write_file_atomic(dir / "adapter_config.json", files.config.dump(2) + "\n");
}

}  // namespace refit::io
