#pragma once
// The dataset interface. A sample is a set of named tensors (refit/fields.h); the dataset says
// which fields it produces and how variable-length ones are padded. get(), sample() and
// sample_batch() must be safe to call from several threads at once (the loader's workers).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/fields.h"

namespace refit {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  /// The fields every sample carries ("pixel_values", "labels"), with padding rules for those
  /// whose length varies. `refit validate` checks every field a model, objective or evaluator
  /// reads against this list.
  virtual std::vector<FieldInfo> fields() const = 0;
  virtual Example get(std::int64_t index) const = 0;
  /// What the data loader calls: sample `index` as drawn in epoch `epoch`. Datasets with random
  /// augmentation override it so that every epoch draws fresh augmentations (a function of the
  /// seed, the index and the epoch only, so runs resume exactly); the default is get(index).
  virtual Example sample(std::int64_t index, std::int64_t epoch) const {
    (void)epoch;
    return get(index);
  }
  /// The batch of samples `indices` as drawn in epoch `epoch`, in one piece — for datasets that
  /// can gather a batch faster than sample by sample (a tensor already in memory: one
  /// index_select instead of a select per sample and a stack). Must equal collating
  /// sample(i, epoch) for each index. The default returns nothing: the loader then collates.
  virtual std::optional<Batch> sample_batch(const std::vector<std::int64_t>& indices, std::int64_t epoch) const {
    (void)indices, (void)epoch;
    return std::nullopt;
  }
  /// Number of classes for classification datasets, -1 when not applicable.
  virtual std::int64_t num_classes() const { return -1; }
  /// The classes' names by index ("T-shirt/top", a folder's name, a text label), for people
  /// reading predictions; empty when the classes have no names but their index.
  virtual std::vector<std::string> class_names() const { return {}; }
  /// One line for logs ("synthetic: 512 samples, 16 features, 4 classes").
  virtual std::string describe() const { return "dataset of " + std::to_string(size()) + " samples"; }
};

using DatasetPtr = std::shared_ptr<Dataset>;

/// The names of `fields` (and of the masks their padding produces), for validation.
inline std::vector<std::string> field_names(const std::vector<FieldInfo>& fields) {
  std::vector<std::string> out;
  auto add = [&](const std::string& n) {
    for (const auto& o : out)
      if (o == n) return;
    out.push_back(n);
  };
  for (const auto& f : fields) {
    add(f.name);
    if (f.padded && !f.mask.empty()) add(f.mask);
  }
  return out;
}

}  // namespace refit
