#pragma once
// Runs in-memory recipes from unit tests, their progress output discarded.
#include <cstdio>
#include <memory>
#include <vector>

#include "cli/commands/train.h"
#include "core/recipe_parser.h"
#include "run/assembly.h"

namespace refit::test {

/// Trains the recipe `doc` (relative paths resolve against /tmp) with `extra` callbacks.
inline TrainSummary train_quietly(Json doc, std::vector<CallbackPtr> extra = {}) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> devnull(std::fopen("/dev/null", "w"), &std::fclose);
  return cli::train(Assembly(parse_recipe(std::move(doc), "/tmp")), devnull.get(), std::move(extra));
}

/// The problems an Assembly reports for the recipe `doc`; empty when it is accepted.
inline std::vector<ConfigIssue> recipe_issues(Json doc) {
  try {
    Assembly(parse_recipe(std::move(doc), "/tmp"));
  } catch (const ConfigError& e) {
    return e.issues();
  }
  return {};
}

}  // namespace refit::test
