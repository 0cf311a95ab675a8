#pragma once
// `refit plugins [--path DIR]...`: what plugins a recipe could load, and what each registers.
#include <cstdio>
#include <filesystem>
#include <vector>

namespace refit::cli {

/// Prints the plugin search path (`extra_dirs` first), every plugin found on it with its
/// versions and registrations, then what is built into refit.
void plugins(const std::vector<std::filesystem::path>& extra_dirs, std::FILE* out);

}  // namespace refit::cli
