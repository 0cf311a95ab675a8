#include "core/plugin_loader.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include <boost/dll/shared_library.hpp>

#include "install/install_dirs.h"
#include "refit/plugin.h"

namespace fs = std::filesystem;

namespace refit {

std::string host_torch_version() { return REFIT_TORCH_VERSION_STRING; }
int host_cxx11_abi() { return REFIT_CXX11_ABI; }

namespace {

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 3 && s.compare(s.size() - 3, 3, ".so") == 0);
}

std::vector<std::string> candidate_file_names(const std::string& name) {
  return {"librefit_" + name + ".so", "refit_" + name + ".so", "lib" + name + ".so", name + ".so"};
}

/// Records what a plugin's register function added, by diffing the tables.
template <class T>
std::set<std::string> names_of(const FactoryTable<T>& t) {
  auto v = t.names();
  return {v.begin(), v.end()};
}

struct Snapshot {
  std::set<std::string> models, adapters, datasets, objectives, callbacks;
  explicit Snapshot(const Registry& r)
      : models(names_of(r.models)), adapters(names_of(r.adapters)), datasets(names_of(r.datasets)),
        objectives(names_of(r.objectives)), callbacks(names_of(r.callbacks)) {}
};

void diff_into(const std::set<std::string>& before, const std::set<std::string>& after, const std::string& kind,
               std::vector<std::pair<std::string, std::string>>& out) {
  for (const auto& n : after)
    if (!before.count(n)) out.emplace_back(kind, n);
}

}  // namespace

std::vector<fs::path> PluginLoader::search_path(const std::vector<fs::path>& recipe_dirs) {
  std::vector<fs::path> dirs(recipe_dirs.begin(), recipe_dirs.end());
  if (const char* env = std::getenv("REFIT_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) dirs.emplace_back(item);
  }
  // <prefix>/<libdir>/refit/plugins, as CMakeLists.txt installs them.
  if (const fs::path installed = install::library_dir(); !installed.empty()) dirs.push_back(installed / "plugins");
#ifdef REFIT_BUILD_PLUGIN_DIR
  dirs.emplace_back(REFIT_BUILD_PLUGIN_DIR);
#endif
  return dirs;
}

const PluginInfo& PluginLoader::load(const std::string& name_or_path, const std::vector<fs::path>& recipe_dirs,
                                     const fs::path& base_dir) {
  fs::path file;
  std::vector<fs::path> looked;
  if (looks_like_path(name_or_path)) {
    file = (base_dir / name_or_path).lexically_normal();  // an absolute path stays as it is
    looked.push_back(file);
    if (!fs::is_regular_file(file)) file.clear();
  } else {
    for (const auto& dir : search_path(recipe_dirs)) {
      for (const auto& n : candidate_file_names(name_or_path)) {
        looked.push_back(dir / n);
        if (file.empty() && fs::is_regular_file(dir / n)) file = dir / n;
      }
      if (!file.empty()) break;
    }
  }
  if (file.empty()) {
    std::string msg = "plugin \"" + name_or_path + "\" not found; looked for:";
    for (const auto& l : looked) msg += "\n  " + l.string();
    msg += "\n(add its folder to the recipe's /plugins/paths or to REFIT_PLUGIN_PATH)";
    throw Error(msg);
  }
  file = fs::weakly_canonical(file);
  for (const auto& p : loaded_)
    if (p.path == file) return p;

  auto library = std::make_shared<boost::dll::shared_library>();
  try {
    library->load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw Error("cannot load plugin " + file.string() + ": " + e.what());
  }
  if (!library->has(kPluginEntrySymbol))
    throw Error("plugin " + file.string() + " does not export \"" + kPluginEntrySymbol +
                "\"; define it with REFIT_PLUGIN(name, version, register_fn) from <refit/plugin.h>");
  auto& entry = library->get_alias<const PluginDescriptor*()>(kPluginEntrySymbol);
  const PluginDescriptor* d = entry();
  if (!d) throw Error("plugin " + file.string() + ": entry returned no descriptor");

  // Versions first: nothing else in the descriptor is trusted before the API version matches.
  if (d->api_version != kPluginApiVersion) {
    const std::string changes = plugin_api_changes(d->api_version);
    throw Error("plugin " + file.string() + " was built for refit plugin API version " + std::to_string(d->api_version) +
                ", but this refit (" + kVersion + ") provides API version " + std::to_string(kPluginApiVersion) +
                "; rebuild the plugin against this SDK" + (changes.empty() ? std::string() : " (" + changes + ")"));
  }
  std::string name = d->name ? d->name : "";
  if (std::string(d->torch_version ? d->torch_version : "?") != host_torch_version())
    throw Error("plugin \"" + name + "\" (" + file.string() + ") was built against LibTorch " +
                (d->torch_version ? d->torch_version : "?") + ", but refit runs LibTorch " + host_torch_version() +
                "; rebuild the plugin");
  if (d->cxx11_abi != host_cxx11_abi())
    throw Error("plugin \"" + name + "\" (" + file.string() +
                ") was built with _GLIBCXX_USE_CXX11_ABI=" + std::to_string(d->cxx11_abi) + ", but refit uses " +
                std::to_string(host_cxx11_abi()) + "; rebuild the plugin");
  for (const auto& p : loaded_)
    if (p.name == name) throw Error("two plugins are named \"" + name + "\": " + p.path.string() + " and " + file.string());
  if (!d->register_fn) throw Error("plugin \"" + name + "\" has no register function");

  PluginInfo info{name, d->version ? d->version : "", d->torch_version, d->cxx11_abi, d->api_version, file, {}};
  Snapshot before(registry_);
  Provenance saved = registry_.current_provenance();
  registry_.set_current_provenance(Provenance{name, library});
  // Exceptions from plugin code are turned into host exceptions here, while the library is
  // still mapped: the exception object's destructor may live in the plugin.
  std::string failure;
  try {
    d->register_fn(registry_);
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "unknown exception";
  }
  registry_.set_current_provenance(saved);
  if (!failure.empty()) throw Error("plugin \"" + name + "\" (" + file.string() + "): " + failure);
  Snapshot after(registry_);
  diff_into(before.models, after.models, "model", info.registered);
  diff_into(before.adapters, after.adapters, "adapter", info.registered);
  diff_into(before.datasets, after.datasets, "dataset", info.registered);
  diff_into(before.objectives, after.objectives, "objective", info.registered);
  diff_into(before.callbacks, after.callbacks, "callback", info.registered);
  loaded_.push_back(std::move(info));
  return loaded_.back();
}

void PluginLoader::load_all(const std::vector<fs::path>& recipe_dirs) {
  std::set<std::string> seen_names;
  for (const auto& dir : search_path(recipe_dirs)) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      std::string f = e.path().filename().string();
      if (f.rfind("librefit_", 0) == 0 && f.size() > 3 && f.compare(f.size() - 3, 3, ".so") == 0) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      // Earlier directories shadow later ones, as for load-by-name.
      std::string stem = f.filename().string();
      if (!seen_names.insert(stem).second) continue;
      load(f.string());
    }
  }
}

}  // namespace refit
