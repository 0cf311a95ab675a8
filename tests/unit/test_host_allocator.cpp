// The caching host allocator (framework/memory/host_allocator.h): size classes, reuse, the cap,
// release, tensors from before the switch, several threads at once. It is process-wide: once a
// case installs it, later cases in the same process run on it (as `refit train` does).
#include <atomic>
#include <thread>
#include <vector>

#include <torch/types.h>

#include "memory/host_allocator.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_host_allocator {

using namespace refit;

TEST_CASE("host allocator: size classes cover the request, 64-byte steps below 512, at most 12.5 % above") {
  CHECK(host_allocator_size_class(1) == 64);
  CHECK(host_allocator_size_class(64) == 64);
  CHECK(host_allocator_size_class(65) == 128);
  CHECK(host_allocator_size_class(512) == 512);
  CHECK(host_allocator_size_class(513) == 576);  // 512 + 512 / 8
  CHECK(host_allocator_size_class(131072) == 131072);
  CHECK(host_allocator_size_class(131073) == 147456);  // 128 KiB + 16 KiB
  std::size_t previous = 0;
  for (std::size_t n = 1; n < (std::size_t{1} << 22); n = n * 9 / 8 + 1) {
    const std::size_t c = host_allocator_size_class(n);
    INFO("request " << n << ", class " << c);
    CHECK(c >= n);
    CHECK(c % 64 == 0);
    CHECK(c >= previous);
    if (n > 512) CHECK(static_cast<double>(c) <= 1.125 * static_cast<double>(n) + 64);
    previous = c;
  }
}

TEST_CASE("host allocator: installed, a freed block serves the next request of its class, the cap holds") {
  auto before = torch::arange(1000, torch::kFloat);  // allocated by the system allocator
  // oneDNN's buffers are freed through whichever CPU allocator is current (raw_deallocate): one
  // from before the switch must go back to the system, not into the cache.
  auto onednn_before = torch::randn({64, 64}).to_mkldnn();
  const bool was_installed = caching_host_allocator_installed();  // true when run after another case
  REQUIRE(install_caching_host_allocator({std::size_t{64} << 20}));
  CHECK(caching_host_allocator_installed());
  release_cached_host_memory();
  const HostAllocatorStats s_before = host_allocator_stats();
  before.reset();  // freed through its own deleter, not the cache's
  onednn_before.reset();
  if (!was_installed) {
    CHECK(host_allocator_stats().foreign_frees >= s_before.foreign_frees + 1);
    CHECK(host_allocator_stats().in_use_bytes == s_before.in_use_bytes);
    CHECK(host_allocator_stats().cached_bytes == 0);
  }
  {
    const auto foreign = host_allocator_stats().foreign_frees;
    auto dense = torch::randn({64, 64});
    auto onednn_after = dense.to_mkldnn();  // through the cache both ways
    CHECK(torch::equal(onednn_after.to_dense(), dense));
    onednn_after.reset();
    CHECK(host_allocator_stats().foreign_frees == foreign);
  }

  release_cached_host_memory();
  const HostAllocatorStats s0 = host_allocator_stats();
  CHECK(s0.cached_bytes == 0);
  void* first = nullptr;
  {
    auto t = torch::empty({1000, 100}, torch::kFloat);  // 400,000 bytes
    first = t.data_ptr();
    CHECK(reinterpret_cast<std::uintptr_t>(first) % 64 == 0);
  }
  const HostAllocatorStats s1 = host_allocator_stats();
  CHECK(s1.cached_bytes == host_allocator_size_class(400000));
  CHECK(s1.in_use_bytes == s0.in_use_bytes);
  {
    auto t = torch::empty({100, 999}, torch::kFloat);  // 399,600 bytes: the same class
    CHECK(t.data_ptr() == first);
    t.fill_(2.0f);
    CHECK(t.sum().item<double>() == 2.0 * 99900);
  }
  const HostAllocatorStats s2 = host_allocator_stats();
  CHECK(s2.cache_hits >= s1.cache_hits + 1);

  // Ops give the same results on cached blocks (reused memory is not assumed zero anywhere).
  torch::manual_seed(3);
  auto a = torch::randn({64, 48}), b = torch::randn({48, 32});
  auto expected = torch::mm(a, b).clone();
  for (int i = 0; i < 3; ++i) CHECK(torch::equal(torch::mm(a, b), expected));

  // The cap: at most max_cached_bytes stay cached, blocks above an eighth of it are never kept;
  // the rest goes back to the system.
  install_caching_host_allocator({std::size_t{1} << 20});  // 1 MiB
  release_cached_host_memory();
  {
    std::vector<torch::Tensor> ts;
    for (int i = 0; i < 6; ++i) ts.push_back(torch::empty({128 * 1024}, torch::kFloat));  // 512 KiB each
  }
  CHECK(host_allocator_stats().cached_bytes == 0);  // 512 KiB > an eighth of the cap: never cached
  {
    std::vector<torch::Tensor> ts;
    for (int i = 0; i < 20; ++i) ts.push_back(torch::empty({24 * 1024}, torch::kFloat));  // 96 KiB each
  }
  CHECK(host_allocator_stats().cached_bytes <= (std::size_t{1} << 20));
  CHECK(host_allocator_stats().cached_bytes >= (std::size_t{1} << 19));
  release_cached_host_memory();
  CHECK(host_allocator_stats().cached_bytes == 0);
  install_caching_host_allocator({std::size_t{64} << 20});
}

TEST_CASE("host allocator: two threads allocating and freeing at once leave the books balanced") {
  REQUIRE(install_caching_host_allocator({std::size_t{64} << 20}));
  const std::size_t in_use = host_allocator_stats().in_use_bytes;
  std::atomic<int> wrong{0};  // Catch's assertions are not thread-safe: count, check after
  auto work = [&wrong](int seed) {
    std::vector<torch::Tensor> live;
    for (int i = 0; i < 3000; ++i) {
      const std::int64_t n = 1 + (seed * 7919 + i * 104729) % 20000;
      live.push_back(torch::full({n}, static_cast<float>(i)));
      if (live.size() > 8) {
        if (live.front()[0].item<float>() != static_cast<float>(i - 8)) ++wrong;
        live.erase(live.begin());
      }
    }
  };
  std::thread t1(work, 1), t2(work, 2);
  t1.join();
  t2.join();
  CHECK(wrong == 0);
  CHECK(host_allocator_stats().in_use_bytes == in_use);
}

}  // namespace refit_test_host_allocator
