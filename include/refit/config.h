#pragma once
// ConfigReader: typed, located access to a JSON configuration.
//
// The recipe and every factory's config are read through this class, so every error carries a
// JSON pointer, a wrong type says what was expected and what was found, unknown keys are
// rejected with a did-you-mean, and reading goes on after an error so that *all* problems are
// reported at once. Header-only: plugins use it without linking anything.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "refit/error.h"

namespace refit {

using Json = nlohmann::json;

/// Appends an escaped reference token to a JSON pointer (RFC 6901: "~" -> "~0", "/" -> "~1").
inline std::string json_pointer_append(const std::string& pointer, const std::string& token) {
  std::string out = pointer + "/";
  for (char c : token) {
    if (c == '~') out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

/// Edit distance, for did-you-mean suggestions.
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

/// The closest candidate to `name`, if it is close enough to be a plausible typo.
inline std::optional<std::string> closest_match(const std::string& name, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = std::max<std::size_t>(2, name.size() / 3) + 1;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(name, c);
    if (d < best_distance) best_distance = d, best = c;
  }
  return best;
}

/// " (did you mean "x"?)" or "".
inline std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates) {
  auto m = closest_match(name, candidates);
  return m ? " (did you mean \"" + *m + "\"?)" : std::string();
}

/// Collects problems; shared by every reader of one document.
class ConfigIssues {
 public:
  void add(std::string pointer, std::string message) { issues_.push_back({std::move(pointer), std::move(message)}); }
  bool empty() const { return issues_.empty(); }
  std::size_t size() const { return issues_.size(); }
  const std::vector<ConfigIssue>& list() const { return issues_; }
  void throw_if_any() const {
    if (!issues_.empty()) throw ConfigError(issues_);
  }

 private:
  std::vector<ConfigIssue> issues_;
};

namespace detail {

inline std::string json_type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    case Json::value_t::string: return "string";
    case Json::value_t::array: return "array";
    case Json::value_t::object: return "object";
    default: return "value";
  }
}

/// A short, bounded rendering of a value for messages: scalars as JSON, containers by their size
/// (never a recursive dump: a value may be nested arbitrarily deep).
inline std::string short_dump(const Json& v) {
  if (v.is_object()) return "{...} (" + std::to_string(v.size()) + " keys)";
  if (v.is_array()) return "[...] (" + std::to_string(v.size()) + " elements)";
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

/// Converts `v` to T; on mismatch returns false and says what was expected.
template <class T>
bool convert(const Json& v, T& out, std::string& expected) {
  if constexpr (std::is_same_v<T, bool>) {
    expected = "a boolean";
    if (!v.is_boolean()) return false;
    out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    expected = std::is_unsigned_v<T> ? "a non-negative integer" : "an integer";
    if (!v.is_number_integer()) return false;
    if (std::is_unsigned_v<T> && v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() < 0) return false;
    out = v.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    expected = "a number";
    if (!v.is_number()) return false;
    out = v.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    expected = "a string";
    if (!v.is_string()) return false;
    out = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, Json>) {
    out = v;
  } else if constexpr (is_vector<T>::value) {
    using E = typename T::value_type;
    std::string inner;
    E probe{};
    convert<E>(Json(), probe, inner);  // fills in the element's expectation
    expected = "an array of " + inner.substr(inner.find(' ') + 1) + "s";
    if (!v.is_array()) return false;
    T result;
    for (const auto& e : v) {
      E item{};
      if (!convert<E>(e, item, inner)) return false;
      result.push_back(std::move(item));
    }
    out = std::move(result);
  } else {
    static_assert(sizeof(T) == 0, "unsupported config value type");
  }
  return true;
}

}  // namespace detail

/// Typed reader over one JSON object (or array) at a known pointer.
class ConfigReader {
 public:
  /// `base_dir` is the folder relative paths resolve against (the recipe's folder).
  ConfigReader(Json value, std::string pointer, std::shared_ptr<ConfigIssues> issues, std::filesystem::path base_dir = {})
      : state_(std::make_shared<State>()) {
    state_->value = std::move(value);
    state_->pointer = std::move(pointer);
    state_->issues = std::move(issues);
    state_->base_dir = std::move(base_dir);
  }

  /// A reader over a whole document with its own issue list.
  static ConfigReader root(Json value, std::filesystem::path base_dir = {}) {
    return ConfigReader(std::move(value), "", std::make_shared<ConfigIssues>(), std::move(base_dir));
  }

  const std::string& pointer() const { return state_->pointer; }
  const Json& raw() const { return state_->value; }
  ConfigIssues& issues() const { return *state_->issues; }
  std::shared_ptr<ConfigIssues> issues_ptr() const { return state_->issues; }
  const std::filesystem::path& base_dir() const { return state_->base_dir; }
  std::string pointer_to(const std::string& key) const { return json_pointer_append(pointer(), key); }

  bool is_object() const { return state_->value.is_object(); }
  bool is_array() const { return state_->value.is_array(); }

  /// True when the key is present (and marks it as known).
  bool has(const std::string& key) const {
    state_->known.insert(key);
    return state_->value.is_object() && state_->value.contains(key);
  }

  /// Records a problem at `key` (or at this object when key is empty).
  void error(const std::string& key, const std::string& message) const {
    issues().add(key.empty() ? pointer() : pointer_to(key), message);
  }

  template <class T>
  T required(const std::string& key) const {
    if (!expect_object()) return T{};
    if (!has(key)) {
      error(key, "missing required key");
      return T{};
    }
    return read<T>(key, T{});
  }

  template <class T>
  T optional(const std::string& key, T fallback) const {
    if (!expect_object() || !has(key)) return fallback;
    return read<T>(key, std::move(fallback));
  }

  template <class T>
  std::optional<T> maybe(const std::string& key) const {
    if (!expect_object() || !has(key)) return std::nullopt;
    return read<T>(key, T{});
  }

  /// A string that must be one of `allowed`.
  std::string choice(const std::string& key, const std::vector<std::string>& allowed,
                     std::optional<std::string> fallback = std::nullopt) const {
    const std::string otherwise = fallback.value_or(allowed.front());
    if (!expect_object()) return otherwise;
    if (!has(key)) {
      if (!fallback) error(key, "missing required key");
      return otherwise;
    }
    if (!raw()[key].is_string()) return read<std::string>(key, otherwise);  // records the type error
    std::string v = raw()[key].get<std::string>();
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      error(key, "expected one of " + list + ", got \"" + v + "\"" + did_you_mean(v, allowed));
      return otherwise;
    }
    return v;
  }

  /// A number with bounds.
  template <class T>
  T number_in(const std::string& key, T fallback, T lo, T hi) const {
    T v = optional<T>(key, fallback);
    if (v < lo || v > hi) {
      error(key, "expected a value in [" + Json(lo).dump() + ", " + Json(hi).dump() + "], got " + Json(v).dump());
      return fallback;
    }
    return v;
  }

  /// A path; relative paths resolve against the recipe's folder.
  std::filesystem::path path(const std::string& key) const { return resolve(required<std::string>(key)); }
  std::optional<std::filesystem::path> optional_path(const std::string& key) const {
    auto v = maybe<std::string>(key);
    if (!v) return std::nullopt;
    return resolve(*v);
  }
  std::filesystem::path resolve(const std::string& p) const {
    std::filesystem::path path(p);
    if (path.empty() || path.is_absolute() || state_->base_dir.empty()) return path;
    return (state_->base_dir / path).lexically_normal();
  }

  /// A nested object (an empty one when absent and not required). A `detached` child is not
  /// checked by this reader's finish(): whoever consumes it (a factory) finishes it.
  ConfigReader child(const std::string& key, bool required_key = false, bool detached = false) const {
    Json v = Json::object();
    if (expect_object() && has(key)) {
      v = state_->value[key];
      if (!v.is_object()) {
        error(key, "expected an object, got " + detail::json_type_name(v) + " " + detail::short_dump(v));
        v = Json::object();
      }
    } else if (required_key && is_object()) {
      error(key, "missing required key");
    }
    ConfigReader c(v, pointer_to(key), state_->issues, state_->base_dir);
    return detached ? c : adopt(c);
  }

  /// The elements of an array-valued key (each an independent reader).
  std::vector<ConfigReader> array(const std::string& key, bool required_key = false) const {
    std::vector<ConfigReader> out;
    if (!expect_object()) return out;
    if (!has(key)) {
      if (required_key) error(key, "missing required key");
      return out;
    }
    const Json& v = state_->value[key];
    if (!v.is_array()) {
      error(key, "expected an array, got " + detail::json_type_name(v) + " " + detail::short_dump(v));
      return out;
    }
    for (std::size_t i = 0; i < v.size(); ++i)
      out.push_back(adopt(ConfigReader(v[i], pointer_to(key) + "/" + std::to_string(i), state_->issues, state_->base_dir)));
    return out;
  }

  /// Marks a key as known without reading it (a plugin that reads a key only in some cases).
  void accept(const std::string& key) const { state_->known.insert(key); }

  /// Reports every key present but never asked about (here and in every child), with a
  /// did-you-mean against the keys that were asked about.
  void finish() const {
    if (state_->finished) return;
    state_->finished = true;
    if (state_->value.is_object()) {
      std::vector<std::string> known(state_->known.begin(), state_->known.end());
      for (auto it = state_->value.begin(); it != state_->value.end(); ++it) {
        if (state_->known.count(it.key())) continue;
        std::string msg = "unknown key" + did_you_mean(it.key(), known);
        if (msg == "unknown key" && !known.empty()) {
          std::string list;
          for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
          msg += " (expected one of: " + list + ")";
        }
        error(it.key(), msg);
      }
    }
    for (const auto& c : state_->children) ConfigReader(c).finish();
  }

 private:
  struct State {
    Json value;
    std::string pointer;
    std::shared_ptr<ConfigIssues> issues;
    std::filesystem::path base_dir;
    std::set<std::string> known;
    std::vector<std::shared_ptr<State>> children;
    bool finished = false;
    bool object_error_reported = false;
  };
  explicit ConfigReader(std::shared_ptr<State> s) : state_(std::move(s)) {}

  ConfigReader adopt(ConfigReader child) const {
    state_->children.push_back(child.state_);
    return child;
  }

  bool expect_object() const {
    if (state_->value.is_object()) return true;
    if (!state_->object_error_reported) {
      state_->object_error_reported = true;
      issues().add(pointer(), "expected an object, got " + detail::json_type_name(state_->value) + " " +
                                  detail::short_dump(state_->value));
    }
    return false;
  }

  template <class T>
  T read(const std::string& key, T fallback) const {
    const Json& v = state_->value[key];
    T out{};
    std::string expected;
    if (!detail::convert<T>(v, out, expected)) {
      error(key, "expected " + expected + ", got " + detail::json_type_name(v) + " " + detail::short_dump(v));
      return fallback;
    }
    return out;
  }

  std::shared_ptr<State> state_;
};

}  // namespace refit
