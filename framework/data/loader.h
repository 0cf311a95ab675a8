#pragma once
// Seeded, deterministic batching over a Dataset. The order of epoch e is a function of
// (seed, e) only, so a run can be resumed at any batch.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "refit/dataset.h"
#include "refit/evaluator.h"

namespace refit {

/// How a data-parallel run splits the data between its ranks (docs/distributed.md).
enum class Sharding {
  /// Training: global batch g of an epoch is samples [g*B*W, (g+1)*B*W) of the epoch's order (the
  /// same order on every rank), and rank r reads its r-th slice of B. Every rank has the same
  /// number of batches, so the ranks' steps line up. Without drop_last, a final partial global
  /// batch is split as evenly as possible, and dropped if it has fewer samples than ranks.
  global_batches,
  /// Evaluation: rank r reads the contiguous block [r*n/W, (r+1)*n/W) of the order, in batches
  /// of B; every sample is read exactly once over all ranks (counts may differ by rank).
  contiguous,
};

struct LoaderOptions {
  std::int64_t batch_size = 32;  // per rank
  bool shuffle = true;
  bool drop_last = true;
  std::uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  Sharding sharding = Sharding::global_batches;
};

class DataLoader {
 public:
  DataLoader(DatasetPtr dataset, LoaderOptions options);
  std::int64_t batches_per_epoch() const;
  /// The sample indices of epoch `epoch`, in order.
  std::vector<std::int64_t> epoch_order(std::int64_t epoch) const;
  /// Batch `index` of epoch `epoch`. Thread-safe (prefetch workers call it concurrently).
  Batch batch(std::int64_t epoch, std::int64_t index) const;
  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }

 private:
  DatasetPtr dataset_;
  LoaderOptions options_;
  std::vector<FieldInfo> fields_;
  std::shared_ptr<const std::vector<std::int64_t>> order(std::int64_t epoch) const;
  /// [begin, end) of this rank's batch `index` within the epoch's order.
  std::pair<std::int64_t, std::int64_t> batch_range(std::int64_t index) const;
  mutable std::mutex cache_mutex_;
  mutable std::map<std::int64_t, std::shared_ptr<const std::vector<std::int64_t>>> order_cache_;  // last epochs
};

/// Stacks the samples' fields into a batch. Fields declared padded in `fields` are padded along
/// dimension 0 to the longest sample, and their mask fields are produced; every other field must
/// have one shape in all samples.
Batch collate(const std::vector<Example>& examples, const std::vector<FieldInfo>& fields = {});

/// The batch with every field on `device`.
Batch to_device(Batch batch, torch::Device device, bool non_blocking = true);

/// An evaluator's view of a data set: fixed order, every sample, batches on the run's device.
class LoaderEvalData : public EvalData {
 public:
  LoaderEvalData(DatasetPtr dataset, std::int64_t batch_size, torch::Device device)
      : loader_(std::move(dataset), LoaderOptions{batch_size, false, false, 0}), device_(device) {}
  std::int64_t batches() const override { return loader_.batches_per_epoch(); }
  Batch batch(std::int64_t index) const override { return to_device(loader_.batch(0, index), device_); }
  std::int64_t size() const override { return loader_.dataset().size(); }
  std::int64_t num_classes() const override { return loader_.dataset().num_classes(); }
  std::vector<FieldInfo> fields() const override { return loader_.dataset().fields(); }
  const Dataset& dataset() const { return loader_.dataset(); }

 private:
  DataLoader loader_;
  torch::Device device_;
};

}  // namespace refit
