#include "text/declared_pooling.h"

#include <stdexcept>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/read_file.h"

namespace refit::text {

namespace {

using Json = nlohmann::json;

std::runtime_error bad(const std::filesystem::path& file, const std::string& why) {
  return std::runtime_error(file.string() + ": " + why);
}

std::string shown(const Json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

/// The class name of a sentence-transformers module type: "sentence_transformers.models.Pooling"
/// -> "Pooling" (newer releases moved the classes; the name stayed).
std::string class_name(const std::string& type) {
  const auto dot = type.rfind('.');
  return dot == std::string::npos ? type : type.substr(dot + 1);
}

/// The pooling modes refit computes, by their sentence-transformers key.
struct Mode {
  const char* key;
  const char* output;
};
constexpr Mode kModes[] = {{"pooling_mode_mean_tokens", "mean"},
                           {"pooling_mode_cls_token", "cls"},
                           {"pooling_mode_max_tokens", "max"}};

std::optional<std::string> output_of(const std::string& key) {
  for (const auto& m : kModes)
    if (key == m.key) return std::string(m.output);
  return std::nullopt;
}

/// The Pooling module's config.json: its one true mode, checked.
std::pair<std::string, std::string> pooling_mode(const std::filesystem::path& dir, const std::string& folder,
                                                 std::int64_t hidden_size) {
  const std::string name = (std::filesystem::path(folder) / "config.json").generic_string();
  const auto file = dir / name;
  const auto j = read_json_if_present(file);
  if (!j) throw bad(file, "cannot be read (modules.json lists the Pooling module in \"" + folder + "\")");
  if (!j->is_object()) throw bad(file, "not a JSON object");
  std::vector<std::string> on;
  for (const auto& [key, v] : j->items()) {
    if (key.rfind("pooling_mode_", 0) == 0 || key == "include_prompt") {
      if (!v.is_boolean()) throw bad(file, "\"" + key + "\" must be true or false, got " + shown(v));
      if (key != "include_prompt" && v.get<bool>()) on.push_back(key);
    } else if (key == "word_embedding_dimension") {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > 65536)
        throw bad(file, "\"word_embedding_dimension\" must be an integer in [1, 65536], got " + shown(v));
      if (v.get<std::int64_t>() != hidden_size)
        throw bad(file, "\"word_embedding_dimension\" is " + v.dump() + ", but the model's hidden_size is " +
                            std::to_string(hidden_size));
    }
  }
  const std::string computed = "the bert model computes pooling_mode_mean_tokens, pooling_mode_cls_token and "
                               "pooling_mode_max_tokens; set \"output\" in the recipe to choose one";
  if (on.empty()) throw bad(file, "no \"pooling_mode_...\" is true (" + computed + ")");
  if (on.size() > 1)
    throw bad(file, "\"" + on[0] + "\" and \"" + on[1] +
                        "\" are both true: sentence-transformers concatenates the poolings, which " + computed);
  const auto output = output_of(on[0]);
  if (!output) throw bad(file, "\"" + on[0] + "\" is not supported (" + computed + ")");
  return {*output, name + " " + on[0]};
}

}  // namespace

DeclaredPooling declared_pooling(const std::filesystem::path& dir, std::int64_t hidden_size, bool need_output) {
  DeclaredPooling d;
  const auto file = dir / "modules.json";
  const auto j = read_json_if_present(file);
  if (!j) return d;
  if (!j->is_array()) throw bad(file, "not a JSON array of modules");
  std::optional<std::string> pooling;  // the Pooling module's folder
  bool normalize = false;
  for (std::size_t i = 0; i < j->size(); ++i) {
    const Json& m = (*j)[i];
    const std::string at = "module " + std::to_string(i);
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string())
      throw bad(file, at + ": expected an object with a string \"type\", got " + shown(m));
    if (m.contains("path") && !m["path"].is_string())
      throw bad(file, at + ": \"path\" must be a string, got " + shown(m["path"]));
    const std::string type = m["type"].get<std::string>();
    const std::string cls = class_name(type);
    if (cls == "Transformer") continue;
    if (cls == "Normalize") {
      if (!pooling) throw bad(file, at + ": \"" + type + "\" before the Pooling module is not supported");
      normalize = true;
    } else if (cls == "Pooling") {
      if (pooling) throw bad(file, at + ": a second Pooling module is not supported");
      const std::string path = m.value("path", std::string());
      const std::filesystem::path p(path);
      bool inside = !path.empty() && p.is_relative();
      for (const auto& part : p) inside = inside && part != "..";
      if (!inside)
        throw bad(file, at + ": \"path\" must name a folder inside the model folder, got " +
                            (m.contains("path") ? shown(m["path"]) : std::string("none")));
      pooling = path;
    } else {
      throw bad(file, at + ": \"" + type +
                          "\" is not supported by the bert model (it computes Transformer, Pooling and Normalize); set "
                          "\"output\" and \"normalize\" in the recipe to use the model without it");
    }
  }
  d.normalize = normalize;
  d.normalize_source = normalize ? "modules.json Normalize" : "modules.json, no Normalize";
  if (need_output) {
    if (!pooling) throw bad(file, "lists no Pooling module; set \"output\" in the recipe");
    std::tie(d.output, d.output_source) = pooling_mode(dir, *pooling, hidden_size);
  }
  return d;
}

}  // namespace refit::text
