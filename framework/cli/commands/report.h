#pragma once
// `refit report RUN_DIR`: the run's report.html and metrics.csv, rebuilt from its folder.
#include <cstdio>
#include <filesystem>

namespace refit::cli {

/// Rebuilds report.html and metrics.csv from metrics.jsonl, summary.json and recipe.json, and
/// names them on `out`.
void report(const std::filesystem::path& run_dir, std::FILE* out);

}  // namespace refit::cli
