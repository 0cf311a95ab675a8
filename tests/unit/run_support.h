#pragma once
// Runs in-memory recipes from unit tests, their progress output discarded.
#include <cstdio>
#include <memory>
#include <vector>

#include "run/session.h"

namespace refit::test {

/// Trains the recipe `doc` (relative paths resolve against /tmp) with `extra` callbacks.
inline TrainSummary train_quietly(Json doc, std::vector<CallbackPtr> extra = {}) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  return Session(parse_recipe(std::move(doc), "/tmp")).train(devnull.get(), std::move(extra));
}

/// The problems a Session reports for the recipe `doc`; empty when it is accepted.
inline std::vector<ConfigIssue> recipe_issues(Json doc) {
  try {
    Session session(parse_recipe(std::move(doc), "/tmp"));
  } catch (const ConfigError& e) {
    return e.issues();
  }
  return {};
}

}  // namespace refit::test
