#include "cli/commands/plugins.h"

#include "core/plugin_loader.h"
#include "run/assembly.h"

namespace refit::cli {

void plugins(const std::vector<std::filesystem::path>& extra_dirs, std::FILE* out) {
  Registry registry;
  register_builtins(registry);
  PluginLoader loader(registry);
  std::fprintf(out, "search path:\n");
  for (const auto& d : PluginLoader::search_path(extra_dirs)) std::fprintf(out, "  %s\n", d.c_str());
  loader.load_all(extra_dirs);
  for (const auto& p : loader.loaded()) {
    std::fprintf(out, "\n%s %s  (API %u, LibTorch %s, C++11 ABI %d)\n  %s\n", p.name.c_str(), p.version.c_str(),
                 p.api_version, p.torch_version.c_str(), p.cxx11_abi, p.path.c_str());
    for (const auto& r : p.registered) std::fprintf(out, "  %-10s %s\n", r.first.c_str(), r.second.c_str());
  }
  std::fprintf(out, "\nrefit (built-in)\n");
  const std::string builtin = "refit (built-in)";
  for (const auto& n : registry.objectives.all())
    if (n.second.provenance.plugin == builtin) std::fprintf(out, "  %-10s %s\n", "objective", n.first.c_str());
  for (const auto& n : registry.evaluators.all())
    if (n.second.provenance.plugin == builtin) std::fprintf(out, "  %-10s %s\n", "evaluator", n.first.c_str());
}

}  // namespace refit::cli
