#include "data/loader.h"

#include <algorithm>
#include <numeric>
#include <random>

#include <ATen/ATen.h>

#include "refit/error.h"

namespace refit {

DataLoader::DataLoader(DatasetPtr dataset, LoaderOptions options) : dataset_(std::move(dataset)), options_(options) {
  if (!dataset_) throw Error("data loader: no dataset");
  if (dataset_->size() == 0) throw Error("data loader: the dataset is empty");
}

std::int64_t DataLoader::batches_per_epoch() const {
  std::int64_t n = dataset_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

std::vector<std::int64_t> DataLoader::epoch_order(std::int64_t epoch) const {
  std::vector<std::int64_t> order(dataset_->size());
  std::iota(order.begin(), order.end(), 0);
  if (!options_.shuffle) return order;
  // Explicit Fisher-Yates on mt19937_64: std::shuffle's algorithm is implementation-defined.
  std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(epoch));
  for (std::size_t i = order.size(); i > 1; --i) {
    std::size_t j = static_cast<std::size_t>(rng() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

std::shared_ptr<const std::vector<std::int64_t>> DataLoader::order(std::int64_t epoch) const {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  auto it = order_cache_.find(epoch);
  if (it != order_cache_.end()) return it->second;
  auto o = std::make_shared<const std::vector<std::int64_t>>(epoch_order(epoch));
  order_cache_[epoch] = o;
  while (order_cache_.size() > 2) order_cache_.erase(order_cache_.begin());  // prefetch spans at most two epochs
  return o;
}

Batch DataLoader::batch(std::int64_t epoch, std::int64_t index) const {
  auto ord = order(epoch);
  std::int64_t begin = index * options_.batch_size;
  std::int64_t end = std::min<std::int64_t>(begin + options_.batch_size, ord->size());
  std::vector<std::int64_t> indices(ord->begin() + begin, ord->begin() + end);
  if (auto whole = dataset_->sample_batch(indices, epoch)) return std::move(*whole);
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (std::int64_t i : indices) examples.push_back(dataset_->sample(i, epoch));
  return collate(examples);
}

Batch collate(const std::vector<Example>& examples) {
  std::vector<at::Tensor> inputs, targets;
  const std::size_t views = examples.empty() ? 0 : examples.front().views.size();
  std::vector<std::vector<at::Tensor>> per_view(views);
  for (const auto& e : examples) {
    inputs.push_back(e.input);
    targets.push_back(e.target);
    if (e.views.size() != views || e.global_views != examples.front().global_views)
      throw Error("data: samples of one batch have different views (" + std::to_string(views) + " and " +
                  std::to_string(e.views.size()) + " views, " + std::to_string(examples.front().global_views) + " and " +
                  std::to_string(e.global_views) + " global)");
    for (std::size_t v = 0; v < views; ++v) per_view[v].push_back(e.views[v]);
  }
  Batch b{at::stack(inputs), at::stack(targets), {}};
  for (auto& v : per_view) b.views.push_back(at::stack(v));
  if (!examples.empty()) b.global_views = examples.front().global_views;
  return b;
}

Batch to_device(Batch batch, torch::Device device, bool non_blocking) {
  batch.input = batch.input.to(device, non_blocking);
  batch.target = batch.target.to(device, non_blocking);
  for (auto& v : batch.views) v = v.to(device, non_blocking);
  return batch;
}

}  // namespace refit
