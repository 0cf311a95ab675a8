#include "data/loader.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include <ATen/ATen.h>

#include "refit/error.h"
#include "refit/shuffle.h"

namespace refit {

DataLoader::DataLoader(DatasetPtr dataset, LoaderOptions options) : dataset_(std::move(dataset)), options_(options) {
  if (!dataset_) throw Error("data loader: no dataset");
  if (dataset_->size() == 0) throw Error("data loader: the dataset is empty");
  if (options_.batch_size < 1) throw Error("data loader: the batch size must be positive");
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size)
    throw Error("data loader: rank " + std::to_string(options_.rank) + " is outside a world of " +
                std::to_string(options_.world_size));
  fields_ = dataset_->fields();
}

namespace {

/// Rank r's block of n items split over w ranks as evenly as possible (the first n % w get one more).
std::pair<std::int64_t, std::int64_t> even_block(std::int64_t n, std::int64_t w, std::int64_t r) {
  const std::int64_t base = n / w, extra = n % w;
  const std::int64_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

}  // namespace

std::int64_t DataLoader::batches_per_epoch() const {
  const std::int64_t n = dataset_->size(), b = options_.batch_size, w = options_.world_size;
  if (w == 1) return options_.drop_last ? n / b : (n + b - 1) / b;
  if (options_.sharding == Sharding::contiguous) {
    auto [begin, end] = even_block(n, w, options_.rank);
    const std::int64_t m = end - begin;
    return options_.drop_last ? m / b : (m + b - 1) / b;
  }
  const std::int64_t global = b * w, rem = n % global;
  return n / global + (!options_.drop_last && rem >= w ? 1 : 0);
}

std::pair<std::int64_t, std::int64_t> DataLoader::batch_range(std::int64_t index) const {
  const std::int64_t n = dataset_->size(), b = options_.batch_size, w = options_.world_size, r = options_.rank;
  if (w == 1) return {index * b, std::min(index * b + b, n)};
  if (options_.sharding == Sharding::contiguous) {
    auto [block_begin, block_end] = even_block(n, w, r);
    const std::int64_t begin = block_begin + index * b;
    return {begin, std::min(begin + b, block_end)};
  }
  const std::int64_t global = b * w, full = n / global;
  if (index < full) return {index * global + r * b, index * global + (r + 1) * b};
  // The final partial global batch, split evenly (batches_per_epoch counts it only when every
  // rank gets at least one sample).
  auto [begin, end] = even_block(n - full * global, w, r);
  return {full * global + begin, full * global + end};
}

std::vector<std::int64_t> DataLoader::epoch_order(std::int64_t epoch) const {
  std::vector<std::int64_t> order(dataset_->size());
  std::iota(order.begin(), order.end(), 0);
  if (!options_.shuffle) return order;
  std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(epoch));
  seeded_shuffle(order, rng);
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
  auto [begin, end] = batch_range(index);
  if (begin < 0 || end > static_cast<std::int64_t>(ord->size()) || begin >= end)
    throw Error("data loader: batch " + std::to_string(index) + " is outside epoch " + std::to_string(epoch) + " (" +
                std::to_string(batches_per_epoch()) + " batches)");
  std::vector<std::int64_t> indices(ord->begin() + begin, ord->begin() + end);
  if (auto whole = dataset_->sample_batch(indices, epoch)) return std::move(*whole);
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (std::int64_t i : indices) examples.push_back(dataset_->sample(i, epoch));
  return collate(examples, fields_);
}

namespace {

std::string shape_of(const at::Tensor& t) { return c10::str(t.sizes()); }

}  // namespace

Batch collate(const std::vector<Example>& examples, const std::vector<FieldInfo>& fields) {
  Batch b;
  b.samples = static_cast<std::int64_t>(examples.size());
  if (examples.empty()) return b;
  const auto names = examples.front().names();
  for (std::size_t s = 1; s < examples.size(); ++s)
    if (examples[s].names() != names)
      throw Error("data: the samples of one batch carry different fields (" + examples.front().list() + " and " +
                  examples[s].list() + ")");
  auto info_of = [&](const std::string& name) -> const FieldInfo* {
    for (const auto& f : fields)
      if (f.name == name) return &f;
    return nullptr;
  };
  std::map<std::string, at::Tensor> masks;  // mask name -> [B, longest]
  for (const auto& name : names) {
    std::vector<at::Tensor> parts;
    parts.reserve(examples.size());
    for (const auto& e : examples) parts.push_back(e.at(name));
    const FieldInfo* info = info_of(name);
    if (!info || !info->padded) {
      for (std::size_t s = 1; s < parts.size(); ++s)
        if (!parts[s].sizes().equals(parts.front().sizes()))
          throw Error("data: field \"" + name + "\" has shape " + shape_of(parts.front()) + " in one sample and " +
                      shape_of(parts[s]) +
                      " in another; a field whose length varies must be declared padded by its dataset");
      b.set(name, at::stack(parts));
      continue;
    }
    // Variable length along dimension 0: pad every sample to the batch's longest.
    std::int64_t longest = 0;
    for (const auto& p : parts) {
      if (p.dim() == 0) throw Error("data: padded field \"" + name + "\" is a scalar in a sample; expected [length, ...]");
      if (!p.sizes().slice(1).equals(parts.front().sizes().slice(1)))
        throw Error("data: padded field \"" + name + "\" has shape " + shape_of(parts.front()) + " in one sample and " +
                    shape_of(p) + " in another; only dimension 0 may differ");
      longest = std::max(longest, p.size(0));
    }
    std::vector<std::int64_t> shape{static_cast<std::int64_t>(parts.size()), longest};
    for (auto d : parts.front().sizes().slice(1)) shape.push_back(d);
    at::Tensor out = at::full(shape, info->pad_value, parts.front().options());
    at::Tensor mask = at::zeros({static_cast<std::int64_t>(parts.size()), longest}, at::kLong);
    for (std::size_t s = 0; s < parts.size(); ++s) {
      const std::int64_t n = parts[s].size(0);
      out[static_cast<std::int64_t>(s)].narrow(0, 0, n).copy_(parts[s]);
      mask[static_cast<std::int64_t>(s)].narrow(0, 0, n).fill_(1);
    }
    b.set(name, out);
    if (!info->mask.empty()) {
      auto [it, fresh] = masks.emplace(info->mask, mask);
      if (!fresh && !it->second.equal(mask))
        throw Error("data: fields sharing the mask \"" + info->mask + "\" have different lengths in one sample");
    }
  }
  for (auto& [name, mask] : masks) {
    if (b.has(name)) throw Error("data: the mask \"" + name + "\" produced by padding is also a field of the samples");
    b.set(name, mask);
  }
  return b;
}

Batch to_device(Batch batch, torch::Device device, bool non_blocking) {
  for (auto& kv : batch) kv.second = kv.second.to(device, non_blocking);
  return batch;
}

}  // namespace refit
