// Encodes a list of texts with refit's byte-level BPE tokenizer (from a GGUF file) and prints its
// throughput as JSON lines; bench/tokenizer_throughput.py runs it beside Hugging Face `tokenizers`
// on the same texts and prints the comparison (docs/text.md):
//   bench_tokenizer_throughput FILE.gguf TEXTS.json PASSES THREADS
// TEXTS.json is a JSON array of strings. One untimed pass first (the word cache fills, as the
// peer's does), then PASSES timed passes single-threaded and PASSES with THREADS long-lived threads
// (the texts cut into THREADS contiguous parts, one tokenizer shared); the best pass of each is
// reported.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "refit/error.h"
#include "text/byte_bpe.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s FILE.gguf TEXTS.json PASSES THREADS\n", argv[0]);
    return 2;
  }
  try {
    const auto t_load = std::chrono::steady_clock::now();
    const auto tok = refit::text::ByteBpeTokenizer::from_gguf(refit::io::GgufFile::open(argv[1]));
    const double load_s = seconds_since(t_load);
    std::ifstream in(argv[2]);
    const auto texts = nlohmann::json::parse(in).get<std::vector<std::string>>();
    const int passes = std::max(1, std::atoi(argv[3]));
    const int threads = std::max(1, std::atoi(argv[4]));
    std::size_t bytes = 0;
    for (const auto& t : texts) bytes += t.size();

    std::size_t ids = 0;
    auto t_cold = std::chrono::steady_clock::now();
    for (const auto& t : texts) ids += tok.encode(t).size();
    const double cold_s = seconds_since(t_cold);

    // Single-threaded passes are also timed in process CPU time: on a shared machine, wall time
    // counts the other processes' turns too.
    double best_single = 1e30, best_single_cpu = 1e30;
    for (int p = 0; p < passes; ++p) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::clock_t c0 = std::clock();
      std::size_t n = 0;
      for (const auto& t : texts) n += tok.encode(t).size();
      best_single = std::min(best_single, seconds_since(t0));
      best_single_cpu = std::min(best_single_cpu, static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
      if (n != ids) throw refit::Error("ids differ between passes");
    }
    // Batch: `threads` long-lived workers (as a data loader's), each over its contiguous part, the
    // passes separated by a barrier so that the main thread times each pass as a whole. The first
    // pass fills the workers' word caches (they are per thread) and is not counted.
    double best_batch = 1e30;
    {
      std::mutex mu;
      std::condition_variable cv;
      int generation = 0, done = 0;
      std::vector<std::thread> pool;
      for (int k = 0; k < threads; ++k)
        pool.emplace_back([&, k] {
          const std::size_t a = texts.size() * k / threads, b = texts.size() * (k + 1) / threads;
          for (int p = 0; p <= passes; ++p) {
            {
              std::unique_lock<std::mutex> lock(mu);
              cv.wait(lock, [&] { return generation > p; });
            }
            std::size_t n = 0;
            for (std::size_t i = a; i < b; ++i) n += tok.encode(texts[i]).size();
            std::lock_guard<std::mutex> lock(mu);
            ++done;
            cv.notify_all();
          }
        });
      for (int p = 0; p <= passes; ++p) {
        const auto t0 = std::chrono::steady_clock::now();
        {
          std::lock_guard<std::mutex> lock(mu);
          done = 0;
          ++generation;
        }
        cv.notify_all();
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return done == threads; });
        if (p > 0) best_batch = std::min(best_batch, seconds_since(t0));
      }
      for (auto& th : pool) th.join();
    }
    const double mb = static_cast<double>(bytes) / 1e6;
    std::printf("{\"impl\": \"refit\", \"texts\": %zu, \"bytes\": %zu, \"ids\": %zu, \"load_s\": %.3f, "
                "\"cold_mb_per_s\": %.2f, \"single_mb_per_s\": %.2f, \"single_cpu_mb_per_s\": %.2f, \"batch_threads\": %d, "
                "\"batch_mb_per_s\": %.2f}\n",
                texts.size(), bytes, ids, load_s, mb / cold_s, mb / best_single, mb / best_single_cpu, threads,
                mb / best_batch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
