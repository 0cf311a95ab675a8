#include "text/read_file.h"

#include <fstream>
#include <sstream>

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

}  // namespace refit::text
