#pragma once
// The run report: one self-contained HTML page (<run dir>/report.html: inline SVG plots and CSS,
// no script, nothing fetched) and the metrics as CSV (<run dir>/metrics.csv), both built from the
// files the run wrote: metrics.jsonl, summary.json (its "environment") and recipe.json. `refit
// train` writes them at the end of a run; `refit report RUN_DIR` rebuilds them.
#include <filesystem>

#include <nlohmann/json.hpp>

namespace refit {

/// Writes <run_dir>/recipe.json: the recipe document as run (overrides applied).
void write_run_recipe(const std::filesystem::path& run_dir, const nlohmann::json& document);

/// Reads <run_dir>/metrics.jsonl (required) and summary.json, recipe.json (when present) and
/// writes <run_dir>/report.html and <run_dir>/metrics.csv. Throws refit::Error when metrics.jsonl
/// is missing or a line of it is not JSON (naming the line).
void write_run_report(const std::filesystem::path& run_dir);

}  // namespace refit
