// The data loader: seeded, deterministic order (restorable at any step); prefetch workers give
// exactly the batches a single thread would, in order, and surface dataset errors.
#include <algorithm>
#include <atomic>
#include <numeric>

#include "data/prefetcher.h"
#include "refit/shuffle.h"
#include "data_support.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_loader {

using namespace refit;
using namespace refit::test;

namespace {
class Indexed : public LabelledDataset {
 public:
  explicit Indexed(std::int64_t n, std::int64_t bad = -1) : n_(n), bad_(bad) {}
  std::int64_t size() const override { return n_; }
  Example get(std::int64_t i) const override {
    if (i == bad_) throw Error("sample " + std::to_string(i) + " is corrupt");
    return labelled(torch::full({2}, static_cast<float>(i)), torch::tensor(i, torch::kLong));
  }

 private:
  std::int64_t n_, bad_;
};
}  // namespace

TEST_CASE("the shuffle is a permutation that depends only on (seed, epoch)") {
  auto data = std::make_shared<Indexed>(100);
  DataLoader a(data, {10, true, true, 3}), b(data, {10, true, true, 3}), c(data, {10, true, true, 4});
  auto o = a.epoch_order(0);
  CHECK(o == b.epoch_order(0));
  CHECK(o != a.epoch_order(1));
  CHECK(o != c.epoch_order(0));
  auto sorted = o;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> iota(100);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota);
  // Batch (epoch 1, index 4) is the same whether or not earlier batches were read.
  CHECK(torch::equal(label_of(a.batch(1, 4)), label_of(b.batch(1, 4))));
  DataLoader no_drop(data, {30, false, false, 0});
  CHECK(no_drop.batches_per_epoch() == 4);
  CHECK(no_drop.batch(0, 3).size() == 10);
}

TEST_CASE("prefetch workers return the single-threaded stream, across epochs and from any start") {
  auto data = std::make_shared<Indexed>(64);
  DataLoader loader(data, {8, true, true, 11});
  for (int workers : {0, 1, 3}) {
    INFO(workers << " workers");
    Prefetcher p(loader, 5, 30, PrefetchOptions{workers, 4, false});
    for (std::int64_t s = 5; s < 30; ++s) {
      auto expected = loader.batch(s / 8, s % 8);
      auto got = p.get(s);
      CHECK(torch::equal(input_of(got), input_of(expected)));
      CHECK(torch::equal(label_of(got), label_of(expected)));
    }
  }
}

TEST_CASE("a dataset error in a worker reaches the loop with its message") {
  auto data = std::make_shared<Indexed>(16, 9);
  DataLoader loader(data, {4, false, true, 0});
  Prefetcher p(loader, 0, 4, PrefetchOptions{2, 2, false});
  // The batches before the bad one arrive whole and in order; the bad one raises its message.
  CHECK(torch::equal(input_of(p.get(0)), input_of(loader.batch(0, 0))));
  CHECK(torch::equal(label_of(p.get(1)), label_of(loader.batch(0, 1))));
  CHECK_THROWS_WITH(p.get(2), Catch::Contains("sample 9 is corrupt"));
}

namespace {
/// Indexed, gathering whole batches with index_select (what tensor-backed datasets do).
class IndexedTensor : public Indexed {
 public:
  explicit IndexedTensor(std::int64_t n) : Indexed(n), x_(torch::arange(n, torch::kFloat).unsqueeze(1).repeat({1, 2})) {}
  std::optional<Batch> sample_batch(const std::vector<std::int64_t>& indices, std::int64_t) const override {
    ++calls;
    auto idx = torch::tensor(indices, torch::kLong);
    return labelled_batch(x_.index_select(0, idx), idx.clone());
  }
  mutable std::atomic<int> calls{0};

 private:
  torch::Tensor x_;
};
}  // namespace

TEST_CASE("a dataset that gathers whole batches gives the batches collated sample by sample") {
  auto whole = std::make_shared<IndexedTensor>(50);
  DataLoader a(std::make_shared<Indexed>(50), {8, true, false, 5}), b(whole, {8, true, false, 5});
  for (std::int64_t epoch : {0, 1})
    for (std::int64_t i = 0; i < a.batches_per_epoch(); ++i) {
      auto x = a.batch(epoch, i), y = b.batch(epoch, i);
      CHECK(torch::equal(input_of(x), input_of(y)));
      CHECK(torch::equal(label_of(x), label_of(y)));
    }
  CHECK(whole->calls == 2 * b.batches_per_epoch());  // the loader asked for whole batches
}

namespace {
std::vector<std::int64_t> labels_of(const Batch& b) {
  auto l = b.at("labels");
  return std::vector<std::int64_t>(l.data_ptr<std::int64_t>(), l.data_ptr<std::int64_t>() + l.numel());
}
}  // namespace

TEST_CASE("data-parallel shards: the ranks' batches g together are one process's global batch g") {
  auto data = std::make_shared<Indexed>(103);
  for (bool drop_last : {true, false})
    for (int world : {2, 3, 4}) {
      CAPTURE(drop_last, world);
      const std::int64_t b = 5;
      DataLoader one(data, LoaderOptions{b * world, true, drop_last, 9});
      std::vector<std::unique_ptr<DataLoader>> ranks;
      for (int r = 0; r < world; ++r)
        ranks.push_back(
            std::make_unique<DataLoader>(data, LoaderOptions{b, true, drop_last, 9, r, world, Sharding::global_batches}));
      const std::int64_t batches = ranks[0]->batches_per_epoch();
      for (const auto& rank : ranks) REQUIRE(rank->batches_per_epoch() == batches);  // the ranks' steps line up
      // drop_last: only whole global batches. Without: the final partial one (103 % (5w) samples)
      // too, split evenly, when every rank gets one sample at least (not for w = 4: 3 samples).
      const std::int64_t full = 103 / (b * world), rem = 103 % (b * world);
      REQUIRE(batches == full + (!drop_last && rem >= world ? 1 : 0));
      for (std::int64_t epoch : {0, 1})
        for (std::int64_t g = 0; g < batches; ++g) {
          std::vector<std::int64_t> joined;
          for (const auto& rank : ranks) {
            auto part = labels_of(rank->batch(epoch, g));
            REQUIRE(!part.empty());
            joined.insert(joined.end(), part.begin(), part.end());
          }
          REQUIRE(joined == labels_of(one.batch(epoch, g)));
        }
    }
}

TEST_CASE("data-parallel shards: a final global batch with fewer samples than ranks is dropped") {
  auto data = std::make_shared<Indexed>(21);  // 2 global batches of 2x5, then 1 sample for 2 ranks
  DataLoader r0(data, LoaderOptions{5, true, false, 0, 0, 2, Sharding::global_batches});
  DataLoader r1(data, LoaderOptions{5, true, false, 0, 1, 2, Sharding::global_batches});
  REQUIRE(r0.batches_per_epoch() == 2);
  REQUIRE(r1.batches_per_epoch() == 2);
  REQUIRE_THROWS_WITH(r1.batch(0, 2), Catch::Matchers::Contains("outside epoch 0"));
}

TEST_CASE("data-parallel evaluation blocks cover every sample once") {
  auto data = std::make_shared<Indexed>(51);
  for (int world : {1, 2, 3, 5}) {
    CAPTURE(world);
    std::vector<std::int64_t> seen;
    for (int r = 0; r < world; ++r) {
      DataLoader rank(data, LoaderOptions{4, false, false, 0, r, world, Sharding::contiguous});
      for (std::int64_t i = 0; i < rank.batches_per_epoch(); ++i) {
        auto part = labels_of(rank.batch(0, i));
        seen.insert(seen.end(), part.begin(), part.end());
      }
    }
    std::vector<std::int64_t> all(51);
    std::iota(all.begin(), all.end(), 0);
    REQUIRE(seen == all);
  }
  REQUIRE_THROWS_WITH(DataLoader(data, LoaderOptions{4, false, false, 0, 2, 2}),
                      Catch::Matchers::Contains("outside a world of 2"));
}

// The one seeded shuffle (refit/shuffle.h) behind the data order, dataset splits and the linear
// probe: mt19937_64's sequence is fixed by the C++ standard, so this permutation is the same with
// every compiler and library; a change here changes every recipe's split and data order.
TEST_CASE("seeded_shuffle: a known permutation for seed 42, identical across standard libraries") {
  std::vector<int> v{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::mt19937_64 rng(42);
  seeded_shuffle(v, rng);
  CHECK(v == std::vector<int>{1, 7, 9, 0, 3, 8, 4, 2, 5, 6});
  std::vector<int> empty, one{5};
  seeded_shuffle(empty, rng);
  seeded_shuffle(one, rng);
  CHECK(one == std::vector<int>{5});
}

}  // namespace refit_test_loader
