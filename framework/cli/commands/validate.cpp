#include "cli/commands/validate.h"

namespace refit::cli {

void validate(const Assembly& assembly) {
  auto models = assembly.build_models();
  auto train = assembly.train_data();
  auto val = assembly.val_data();
  std::map<std::string, const Dataset*> sets;
  auto data_sets = assembly.data_sets();
  for (const auto& [name, set] : data_sets) sets[name] = set.get();
  assembly.check_fields(models->model_map(), {{"/data/train", train.get()}, {"/data/val", val.get()}}, sets,
                        *assembly.objective(), assembly.evaluators());
}

}  // namespace refit::cli
