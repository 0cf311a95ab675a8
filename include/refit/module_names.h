#pragma once
// Module names in a reference implementation's memory, where they differ from a model's paths.
//
// A model's module paths are the names in its weights files (the reference checkpoint layout).
// A reference implementation may name some modules differently once loaded: transformers >= 5
// loads Dinov2's "attention.attention.query" as "attention.q_proj" and renames back on save.
// Files that address modules in memory — PEFT adapters (keys, target_modules) — need those names.
// A model whose names differ lists the differences in Model::module_renames() (the vit model);
// a model whose names agree (transformers' BERT) keeps the default, none. Adapters with an
// interchange format write the in-memory names and read both namings.
#include <string>
#include <vector>

namespace refit {

/// A dotted path fragment as the model names it (`file`, "attention.attention.query") and as the
/// reference implementation names it in memory (`memory`, "attention.q_proj").
struct ModuleRename {
  std::string file;
  std::string memory;
};

/// `path` with each whole-component occurrence of a rename's `file` fragment replaced by its
/// `memory` fragment (`to_memory`), or the reverse.
inline std::string rename_module_path(const std::string& path, const std::vector<ModuleRename>& renames,
                                      bool to_memory = true) {
  std::string padded = "." + path + ".", out;
  std::size_t i = 0;
  while (i < padded.size()) {
    bool replaced = false;
    if (padded[i] == '.') {
      for (const auto& r : renames) {
        const std::string from = "." + (to_memory ? r.file : r.memory) + ".";
        if (padded.compare(i, from.size(), from) == 0) {
          out += "." + (to_memory ? r.memory : r.file);
          i += from.size() - 1;  // the closing '.' starts the next component
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) out += padded[i++];
  }
  return out.substr(1, out.size() - 2);
}

}  // namespace refit
