#pragma once
// The registry of named factories that plugins fill in their register function.
//
// A factory is split in two, like an options struct and its module: `parse` reads and checks
// the config (through a ConfigReader, so errors carry JSON pointers) and returns a builder;
// the builder creates the object. `refit validate` runs every parse without building anything.
// Objects created through the registry keep their plugin library loaded for as long as they live.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/adapter.h"
#include "refit/callback.h"
#include "refit/config.h"
#include "refit/dataset.h"
#include "refit/error.h"
#include "refit/evaluator.h"
#include "refit/model.h"
#include "refit/objective.h"

namespace refit {

/// What a builder may know about the run it builds for.
struct BuildContext {
  torch::Device device = torch::kCPU;
  std::uint64_t seed = 0;
  std::filesystem::path run_dir;
  /// A weights file replaces every parameter of the model after it is built (its "weights"):
  /// a model builder then registers parameters that hold no memory instead of initialising them
  /// (nn::unloaded, nn::Init::none in refit/layers.h), and the loader puts each tensor into its
  /// final dtype or storage, so that a large model is never held in float32 or twice.
  bool weights_follow = false;
};

template <class T>
using Builder = std::function<std::shared_ptr<T>(const BuildContext&)>;

template <class T>
using ParseFn = std::function<Builder<T>(const ConfigReader&)>;

/// Which plugin provided a factory; `library` keeps that plugin's code mapped.
struct Provenance {
  std::string plugin = "refit";
  std::shared_ptr<void> library;
};

template <class T>
struct Factory {
  // Declared first so that it is destroyed last: the function objects below live in its code.
  Provenance provenance;
  std::string name;
  std::string description;
  ParseFn<T> parse;
};

template <class T>
class FactoryTable {
 public:
  FactoryTable(std::string kind, const Provenance* current) : kind_(std::move(kind)), current_(current) {}

  /// Adds a factory; a name already taken (by this or another plugin) is an error naming both.
  void add(const std::string& name, const std::string& description, ParseFn<T> parse) {
    auto it = factories_.find(name);
    if (it != factories_.end())
      throw Error("duplicate " + kind_ + " factory \"" + name + "\": registered by plugin \"" +
                  it->second.provenance.plugin + "\" and again by plugin \"" + current_->plugin + "\"");
    factories_.emplace(name, Factory<T>{*current_, name, description, std::move(parse)});
  }

  const Factory<T>* find(const std::string& name) const {
    auto it = factories_.find(name);
    return it == factories_.end() ? nullptr : &it->second;
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& kv : factories_) out.push_back(kv.first);
    return out;
  }

  const std::map<std::string, Factory<T>>& all() const { return factories_; }
  const std::string& kind() const { return kind_; }

  /// Parses `config` for factory `type`; records problems (unknown type with did-you-mean,
  /// config errors, unknown config keys) in the reader's issue list. Returns a builder whose
  /// objects keep the plugin loaded, or an empty function when there were problems.
  Builder<T> parse(const std::string& type, const std::string& type_pointer, const ConfigReader& config) const {
    const Factory<T>* f = find(type);
    if (!f) {
      std::string msg = "unknown " + kind_ + " type \"" + type + "\"" + did_you_mean(type, names());
      auto known = names();
      if (!known.empty()) {
        std::string list;
        for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
        msg += "; registered: " + list;
      } else {
        msg += "; no " + kind_ + " factories are registered (is the plugin listed in /plugins?)";
      }
      config.issues().add(type_pointer, msg);
      return {};
    }
    std::size_t before = config.issues().size();
    Builder<T> inner;
    try {
      inner = f->parse(config);
    } catch (const ConfigError& e) {
      for (const auto& i : e.issues()) config.issues().add(i.pointer, i.message);
    } catch (const std::exception& e) {
      config.issues().add(config.pointer(), e.what());
    }
    config.finish();
    if (config.issues().size() != before || !inner) return {};
    Provenance keep = f->provenance;
    return [inner, keep](const BuildContext& ctx) -> std::shared_ptr<T> {
      std::shared_ptr<T> object;
      try {
        object = inner(ctx);
      } catch (const std::exception& e) {
        // Rethrown as a host exception while the plugin is certainly mapped: the original
        // exception's type and destructor may live in the plugin.
        throw Error(keep.plugin + ": " + e.what());
      }
      if (!object || !keep.library) return object;
      // Tie the plugin's library to the object: the holder releases the object first (its
      // deleter may be plugin code), then the library.
      struct Holder {
        std::shared_ptr<void> library;
        std::shared_ptr<T> object;
      };
      auto holder = std::make_shared<Holder>(Holder{keep.library, object});
      object.reset();
      return std::shared_ptr<T>(holder, holder->object.get());
    };
  }

 private:
  std::string kind_;
  const Provenance* current_;
  std::map<std::string, Factory<T>> factories_;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  FactoryTable<Model> models{"model", &current_};
  FactoryTable<Adapter> adapters{"adapter", &current_};
  FactoryTable<Dataset> datasets{"dataset", &current_};
  FactoryTable<Objective> objectives{"objective", &current_};
  FactoryTable<Callback> callbacks{"callback", &current_};
  FactoryTable<Evaluator> evaluators{"evaluator", &current_};

  /// Set by the plugin loader around a plugin's register call.
  void set_current_provenance(Provenance p) { current_ = std::move(p); }
  const Provenance& current_provenance() const { return current_; }

 private:
  Provenance current_;
};

}  // namespace refit
