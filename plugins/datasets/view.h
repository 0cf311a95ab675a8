#pragma once
// The options every dataset factory accepts, and the view that applies them to a Source:
//
//   "classes":    [c0, c1, ...]  keep these classes; labels become 0..k-1 in this order
//   "split":      {"fraction": f, "part": "first"|"second", "seed": s}, or
//                 {"fractions": [train, val, test], "part": "train"|"val"|"test", "seed": s}
//                 a seeded random split of the samples left after "classes" (the parts of one
//                 seed never overlap; "first" of fraction f is "train" of [f, ...])
//   "limit":      N              the first N samples after the split
//   "transforms": [...]          see transforms.h
//   "multi_crop": {...}          crops of the transformed input as fields "global_crop.<i>" and
//                                "local_crop.<i>" (MultiCrop, transforms.h)
//   "seed":       s              randomness of the transforms and crops (and the split's default seed);
//                                default: the run's /training/seed (BuildContext::seed)
//
// Random draws are a function of (seed, source index, epoch): sample(index, epoch) draws anew
// every epoch, get(index) is sample(index, 0).
//
// The view maps its index to the source's index once, at construction; get() and sample() only
// read const state, so they are as thread-safe as the source's get().
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "refit/config.h"
#include "source.h"
#include "transforms.h"

namespace refit::datasets {

struct ViewOptions {
  std::optional<std::vector<std::int64_t>> classes;
  std::string classes_pointer;
  std::optional<double> split_fraction;                // size of the "first" part
  std::optional<std::vector<double>> split_fractions;  // three-way: [train, val, test]
  std::string split_part = "first";                    // first | second, or train | val | test
  std::uint64_t split_seed = 0;
  std::optional<std::int64_t> limit;
  Transforms transforms;
  std::optional<MultiCrop> multi_crop;
  std::uint64_t seed = 0;
  bool seed_given = false;        // "seed" in the config: else the run's /training/seed
  bool split_seed_given = false;  // "split": {"seed"}: else the view's seed

  /// These options for a run whose /training/seed is `run_seed`: a seed the config leaves out is
  /// the run's (the split's defaults to the view's), so that `--set training.seed=3` changes the
  /// transforms, crops and split of every dataset that does not set its own.
  ViewOptions for_run(std::uint64_t run_seed) const;

  /// Reads the common keys. `input_shape` and `num_classes` (when known at parse time) let the
  /// transforms and classes be checked now rather than at build time. With `split_may_be_string`
  /// a string "split" is left to the factory (fashion_mnist's "train"/"test").
  static ViewOptions from_config(const ConfigReader& c, const std::optional<std::vector<std::int64_t>>& input_shape,
                                 std::int64_t num_classes = -1, bool split_may_be_string = false);
  /// True when no option changes anything: the source is used as it is.
  bool trivial() const {
    return !classes && !split_fraction && !split_fractions && !limit && transforms.empty() && !multi_crop;
  }
};

class View : public Dataset {
 public:
  /// Selects and orders the samples; throws refit::Error (naming the dataset) when a class
  /// does not exist, the transforms or the multi-crop do not fit the source's inputs, or no
  /// sample is left.
  View(std::shared_ptr<const Source> source, ViewOptions options);

  std::int64_t size() const override { return static_cast<std::int64_t>(indices_.size()); }
  /// sample(index, 0).
  Example get(std::int64_t index) const override;
  /// Sample `index` with the transforms and crops drawn for `epoch` (>= 0).
  Example sample(std::int64_t index, std::int64_t epoch) const override;
  std::int64_t num_classes() const override { return num_classes_; }
  /// The source's names of the classes kept, in the view's order.
  std::vector<std::string> class_names() const override;
  /// The source's fields, and with multi_crop "global_crop.<i>" and "local_crop.<i>".
  std::vector<FieldInfo> fields() const override;
  std::string describe() const override;

  /// The source's index of sample `index`.
  std::int64_t source_index(std::int64_t index) const { return indices_.at(static_cast<std::size_t>(index)); }
  const std::vector<std::int64_t>& input_shape() const { return shape_; }

 private:
  std::shared_ptr<const Source> source_;
  ViewOptions options_;
  std::vector<std::int64_t> indices_;  // view index -> source index
  std::vector<std::int64_t> remap_;    // source label -> view label (-1: dropped); empty: identity
  std::int64_t num_classes_ = -1;
  std::vector<std::int64_t> shape_;
};

/// The dataset a factory returns: the source itself when the options are trivial, else a View.
std::shared_ptr<Dataset> make_dataset(std::shared_ptr<const Source> source, const ViewOptions& options);

}  // namespace refit::datasets
