// The datasets plugin: synthetic clusters, Fashion-MNIST (IDX), CSV files and image folders.
// Every factory also takes the common options of view.h (classes, split, limit, transforms).
// Reference: docs/datasets.md.
#include "csv.h"
#include "fashion_mnist.h"
#include "image_folder.h"
#include "refit/plugin.h"
#include "synthetic.h"
#include "view.h"

namespace {

using refit::BuildContext;
using refit::Builder;
using refit::ConfigReader;
using refit::Dataset;
namespace ds = refit::datasets;

/// The options for a run whose /training/seed is `seed`: the seeds the config leaves out are
/// the run's (the view's transforms, crops and split).
template <class Options>
Options for_run(Options o, std::uint64_t seed) {
  o.view = o.view.for_run(seed);
  return o;
}

/// synthetic: its data too (the centres from `seed`, the samples from `sample_seed`, by default
/// the run's seed and seed + 1 — 0 and 1 for the default seed 0, as before).
ds::SyntheticOptions for_run(ds::SyntheticOptions o, std::uint64_t seed) {
  o.view = o.view.for_run(seed);
  if (!o.view.seed_given) o.seed = seed;
  if (!o.sample_seed_given) o.sample_seed = seed + 1;
  return o;
}

/// parse: read the options (errors at JSON pointers); build: load, then apply the view options.
template <class Options, class SourceT>
refit::ParseFn<Dataset> factory() {
  return [](const ConfigReader& c) -> Builder<Dataset> {
    Options o = Options::from_config(c);
    return [o](const BuildContext& ctx) {
      const Options run = for_run(o, ctx.seed);
      return ds::make_dataset(std::make_shared<SourceT>(run), run.view);
    };
  };
}

void register_datasets(refit::Registry& r) {
  r.datasets.add("synthetic", "Gaussian clusters for classification (tests, quick trials)",
                 factory<ds::SyntheticOptions, ds::SyntheticDataset>());
  r.datasets.add("fashion_mnist", "Fashion-MNIST from its IDX files (gzipped or not), [1, 28, 28] in [0, 1]",
                 factory<ds::FashionMnistOptions, ds::FashionMnistDataset>());
  r.datasets.add("csv", "numeric features and an integer label per row of a CSV file (gzipped or not)",
                 factory<ds::CsvOptions, ds::CsvDataset>());
  r.datasets.add("image_folder", "root/<class>/<image> folders (PNG, JPEG, ...), resized to [C, H, W] in [0, 1]",
                 factory<ds::ImageFolderOptions, ds::ImageFolderDataset>());
}

}  // namespace

REFIT_PLUGIN("datasets", "0.1.0", register_datasets)
