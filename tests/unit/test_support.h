#pragma once
// Helpers shared by the unit tests.
#include <string>
#include <vector>

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

inline std::string test_plugin_dir() { return REFIT_TEST_PLUGIN_DIR; }
inline std::string source_dir() { return REFIT_SOURCE_DIR; }

}  // namespace refit::test
