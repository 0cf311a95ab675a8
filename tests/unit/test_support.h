#pragma once
// Helpers shared by the unit tests.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

// c10/util/Logging.h defines a glog-style CHECK macro (abort on failure, not a test assertion);
// included before Catch so that Catch's CHECK is the one every test sees, whatever it includes.
#include <c10/util/Logging.h>
#include <catch2/catch.hpp>

#include "refit/error.h"

namespace refit::test {

/// The pointers of a ConfigError's issues, in order.
inline std::vector<std::string> pointers(const ConfigError& e) {
  std::vector<std::string> out;
  for (const auto& i : e.issues()) out.push_back(i.pointer);
  return out;
}

/// The message found at `pointer`, or "" if none.
inline std::string message_at(const std::vector<ConfigIssue>& issues, const std::string& pointer) {
  for (const auto& i : issues)
    if (i.pointer == pointer) return i.message;
  return "";
}

/// Set by ctest (tests/CMakeLists.txt); a clear failure when the binary is run by hand without them.
inline std::string env_path(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    FAIL(std::string(name) + " is not set: run the tests through ctest, or export it");
  }
  return v;
}
/// The test plugins: $REFIT_TEST_PLUGIN_DIR, else plugins/ under the working directory (ctest
/// runs the unit tests in <build>/tests, where they are built).
inline std::string test_plugin_dir() {
  const char* v = std::getenv("REFIT_TEST_PLUGIN_DIR");
  return v && *v ? std::string(v) : (std::filesystem::current_path() / "plugins").string();
}
inline std::string source_dir() { return env_path("REFIT_SOURCE_DIR"); }

}  // namespace refit::test
