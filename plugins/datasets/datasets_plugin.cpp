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

/// parse: read the options (errors at JSON pointers); build: load, then apply the view options.
template <class Options, class SourceT>
refit::ParseFn<Dataset> factory() {
  return [](const ConfigReader& c) -> Builder<Dataset> {
    Options o = Options::from_config(c);
    return [o](const BuildContext&) { return ds::make_dataset(std::make_shared<SourceT>(o), o.view); };
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
