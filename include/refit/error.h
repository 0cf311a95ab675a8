#pragma once
// Error types. Every user-facing error says *where* (a JSON pointer into the recipe, a file, a
// plugin) and *what* was expected.
#include <stdexcept>
#include <string>
#include <vector>

namespace refit {

/// Base class of every error refit throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One problem found in a configuration, located by a JSON pointer ("/training/duration").
struct ConfigIssue {
  std::string pointer;
  std::string message;
  std::string to_string() const { return (pointer.empty() ? std::string("/") : pointer) + ": " + message; }
};

/// All the problems found while reading a recipe (not just the first).
class ConfigError : public Error {
 public:
  explicit ConfigError(std::vector<ConfigIssue> issues) : Error(join(issues)), issues_(std::move(issues)) {}
  const std::vector<ConfigIssue>& issues() const { return issues_; }

 private:
  static std::string join(const std::vector<ConfigIssue>& issues) {
    std::string out;
    for (const auto& i : issues) {
      if (!out.empty()) out += "\n";
      out += i.to_string();
    }
    return out;
  }
  std::vector<ConfigIssue> issues_;
};

}  // namespace refit
