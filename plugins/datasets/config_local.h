#pragma once
// Nested config readers that stay local to the plugin.
//
// ConfigReader::child() and array() adopt the new reader's state into the parent, which belongs
// to the host's recipe. That state is created here, in plugin code (its shared_ptr control block
// and vtable live in this library), so the recipe would end up destroying plugin objects, possibly
// after the library is unloaded (`refit validate` unloads the plugins before the recipe). These
// helpers make readers that only this plugin holds, and the caller calls finish() on them.
#include <string>
#include <vector>

#include "refit/config.h"

namespace refit::datasets {

/// A reader over object `key` of `c` (an empty object when absent; "expected an object" when it
/// is something else). Not adopted by `c`: call finish() on it.
inline ConfigReader local_child(const ConfigReader& c, const std::string& key) {
  return c.child(key, /*required=*/false, /*detached=*/true);
}

/// Readers over the elements of array `key` of `c` (none when absent; "expected an array" when it
/// is something else). Not adopted by `c`: call finish() on each.
inline std::vector<ConfigReader> local_array(const ConfigReader& c, const std::string& key) {
  std::vector<ConfigReader> out;
  if (!c.is_object() || !c.has(key)) return out;
  const Json& v = c.raw()[key];
  if (!v.is_array()) {
    c.error(key, "expected an array, got " + detail::json_type_name(v) + " " + detail::short_dump(v));
    return out;
  }
  for (std::size_t i = 0; i < v.size(); ++i)
    out.emplace_back(v[i], c.pointer_to(key) + "/" + std::to_string(i), c.issues_ptr(), c.base_dir());
  return out;
}

}  // namespace refit::datasets
