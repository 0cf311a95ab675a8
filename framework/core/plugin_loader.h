#pragma once
// Loads plugins (shared libraries) with Boost.DLL, checks their descriptor before calling any of
// their code, and lets them register factories.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "refit/registry.h"

namespace refit {

struct PluginInfo {
  std::string name;
  std::string version;
  std::string torch_version;
  int cxx11_abi = 0;
  unsigned api_version = 0;
  std::filesystem::path path;
  // What the plugin registered, per kind ("model" -> {"mlp"}).
  std::vector<std::pair<std::string, std::string>> registered;
};

class PluginLoader {
 public:
  explicit PluginLoader(Registry& registry) : registry_(registry) {}

  /// Directories searched, in order: `recipe_dirs`, then REFIT_PLUGIN_PATH (colon-separated),
  /// then the installed plugin directory next to the executable, then the build tree's.
  static std::vector<std::filesystem::path> search_path(const std::vector<std::filesystem::path>& recipe_dirs);

  /// Loads a plugin by name ("vision" -> librefit_vision.so on the search path) or by path
  /// (anything containing '/' or ending in ".so"; a relative path resolves against `base_dir`,
  /// the recipe's folder). Loading the same file twice is a no-op.
  const PluginInfo& load(const std::string& name_or_path, const std::vector<std::filesystem::path>& recipe_dirs = {},
                         const std::filesystem::path& base_dir = {});

  /// Loads every librefit_*.so found on the search path (for `refit plugins`).
  void load_all(const std::vector<std::filesystem::path>& recipe_dirs = {});

  const std::vector<PluginInfo>& loaded() const { return loaded_; }

 private:
  Registry& registry_;
  std::vector<PluginInfo> loaded_;
};

/// The host's own versions, compared against each descriptor.
std::string host_torch_version();
int host_cxx11_abi();

}  // namespace refit
