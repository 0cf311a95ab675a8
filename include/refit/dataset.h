#pragma once
// The dataset interface. get(), sample() and sample_batch() must be safe to call from several
// threads at once (the loader's workers).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

namespace refit {

struct Example {
  torch::Tensor input;   // one sample, no batch dimension
  torch::Tensor target;  // a 0-d int64 class index for classification
  /// Extra views of the same sample (multi-crop augmentation: global crops first, then local
  /// crops; sizes may differ between views but not between samples). Empty for most datasets.
  std::vector<torch::Tensor> views;
  std::int64_t global_views = 0;  // how many of `views` (the first ones) are global crops; 0 = unknown
};

struct Batch {
  torch::Tensor input;   // [B, ...]
  torch::Tensor target;  // [B]
  std::vector<torch::Tensor> views;  // view v of every sample: [B, ...]
  std::int64_t global_views = 0;     // the first `global_views` views are global crops; 0 = unknown
  std::int64_t size() const { return input.defined() ? input.size(0) : 0; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
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
  /// One line for logs ("synthetic: 512 samples, 16 features, 4 classes").
  virtual std::string describe() const { return "dataset of " + std::to_string(size()) + " samples"; }
};

using DatasetPtr = std::shared_ptr<Dataset>;

}  // namespace refit
