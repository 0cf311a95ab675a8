#include "text/read_file.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "refit/error.h"

namespace refit::text {

std::string read_whole_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(what + ": cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw Error(what + ": cannot read " + path);
  return s.str();
}

std::optional<nlohmann::json> read_json_if_present(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw std::runtime_error(file.string() + ": not JSON");
  return j;
}

}  // namespace refit::text
