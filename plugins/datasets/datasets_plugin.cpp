// The datasets plugin.
#include "refit/plugin.h"
#include "synthetic.h"

namespace {

void register_datasets(refit::Registry& r) {
  r.datasets.add("synthetic", "Gaussian clusters for classification (tests, quick trials)",
                 [](const refit::ConfigReader& c) -> refit::Builder<refit::Dataset> {
                   auto o = refit::datasets::SyntheticOptions::from_config(c);
                   return [o](const refit::BuildContext&) {
                     return std::make_shared<refit::datasets::SyntheticDataset>(o);
                   };
                 });
}

}  // namespace

REFIT_PLUGIN("datasets", "0.1.0", register_datasets)
