#pragma once
// Reading a recipe: JSON (with `--set` overrides and ${VARIABLE} expansion) into the plain
// values of core/recipe.h. Parsing never stops at the first problem: every issue is collected
// with its JSON pointer. Only the assembly layer (run/), the CLI and tests include this.
#include <filesystem>
#include <string>
#include <vector>

#include "core/recipe.h"

namespace refit {

/// Applies `--set a.b.0.c=value` overrides (value parsed as JSON, else taken as a string).
void apply_overrides(Json& document, const std::vector<std::string>& overrides);

/// Refuses a document nested deeper than any recipe (or component config) needs — 64 levels —
/// before anything walks it recursively; the check itself is an iterative walk. ConfigError at
/// `where` (a file name, "--input").
void check_json_depth(const Json& document, const std::string& where);

/// Parses a recipe document. Never throws for content problems: they are in `recipe.issues`.
Recipe parse_recipe(Json document, const std::filesystem::path& base_dir);

/// Reads, overrides and parses a recipe file. Throws ConfigError for unreadable/invalid JSON
/// (with line and column) and for bad overrides; content problems are in `recipe.issues`.
Recipe load_recipe(const std::filesystem::path& file, const std::vector<std::string>& overrides = {});
/// load_recipe on a recipe's text in memory (the fuzz target's entry): `file` names it in
/// messages and relative paths resolve against its folder; nothing is read from disk.
Recipe load_recipe_text(const std::string& text, const std::filesystem::path& file,
                        const std::vector<std::string>& overrides = {});

}  // namespace refit
