#pragma once
// Which adaptable layers of a model an adapter attaches to, shared by every adapter plugin:
// PEFT's "target_modules" (a module path, or a path suffix after a '.'), a "target_regex" (RE2
// syntax, refit/regex.h) that must match the whole path, and the layer types taken ("linear", "conv2d"). When nothing
// matches, the error lists the model's adaptable layers.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "refit/config.h"
#include "refit/layers.h"
#include "refit/model.h"
#include "refit/regex.h"

namespace refit {

struct LayerTargets {
  std::string target_regex;                 // full match on the module path
  std::vector<std::string> target_modules;  // a path, or a path suffix after '.'
  std::vector<std::string> layer_types{"linear", "conv2d"};

  /// Reads "target_regex", "target_modules" and "layer_types" (at least one target is required;
  /// a regex that does not compile is reported at its key).
  static LayerTargets from_config(const ConfigReader& c) {
    LayerTargets t;
    t.target_regex = c.optional<std::string>("target_regex", "");
    t.target_modules = c.optional<std::vector<std::string>>("target_modules", {});
    t.layer_types = c.optional<std::vector<std::string>>("layer_types", t.layer_types);
    for (const auto& type : t.layer_types)
      if (type != "linear" && type != "conv2d")
        c.error("layer_types",
                "expected \"linear\" or \"conv2d\", got \"" + type + "\"" + did_you_mean(type, {"linear", "conv2d"}));
    if (t.target_regex.empty() && t.target_modules.empty() && c.is_object())
      c.error("", "set target_regex (full match on module paths) and/or target_modules (PEFT-style names)");
    std::string why;
    if (!t.target_regex.empty() && !compile_regex(t.target_regex, &why))
      c.error("target_regex", "not a valid regex: " + why);
    return t;
  }

  /// The type name of an adaptable layer: "linear" or "conv2d".
  static std::string type_of(const nn::AdaptableLayer& layer) { return layer.kind(); }

  bool matches(const std::string& path, const nn::AdaptableLayer& layer) const {
    if (std::find(layer_types.begin(), layer_types.end(), type_of(layer)) == layer_types.end()) return false;
    if (!target_regex.empty()) {
      std::string why;
      const auto re = compile_regex(target_regex, &why);
      if (!re) throw std::runtime_error("target_regex \"" + target_regex.substr(0, 80) + "\" is not a valid regex: " + why);
      if (regex_full_match(path, *re)) return true;
    }
    for (const auto& t : target_modules) {
      if (path == t) return true;
      if (path.size() > t.size() && path.compare(path.size() - t.size(), t.size(), t) == 0 &&
          path[path.size() - t.size() - 1] == '.')
        return true;
    }
    return false;
  }
};

/// Every adaptable layer of `model`, with its path, in module order.
inline std::vector<std::pair<std::string, nn::AdaptableLayer*>> adaptable_layers(Model& model) {
  std::vector<std::pair<std::string, nn::AdaptableLayer*>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto* layer = dynamic_cast<nn::AdaptableLayer*>(item.value().get())) out.emplace_back(item.key(), layer);
  return out;
}

/// The adaptable layers of `model` that `targets` selects. Throws std::runtime_error, naming
/// `who` ("ia3 \"default\"") and listing the adaptable layers, when none is selected.
inline std::vector<std::pair<std::string, nn::AdaptableLayer*>> target_layers(Model& model, const LayerTargets& targets,
                                                                              const std::string& who) {
  std::vector<std::pair<std::string, nn::AdaptableLayer*>> out;
  const auto all = adaptable_layers(model);
  for (const auto& [path, layer] : all)
    if (targets.matches(path, *layer)) out.emplace_back(path, layer);
  if (out.empty()) {
    std::string list;
    for (const auto& a : all) list += (list.empty() ? "" : ", ") + a.first;
    throw std::runtime_error(who + ": no layer matched the targets; adaptable layers: " +
                             (list.empty() ? "(none: the model has no refit::nn::Linear/Conv2d)" : list));
  }
  return out;
}

}  // namespace refit
