#pragma once
// A seeded split of a dataset's records into train / val / test parts that never overlap and
// cover every record: "split": {"part": "train" | "val" | "test", "fractions": [train, val,
// test], "seed": s}. Shared by the text classification datasets and the language-model datasets
// (plugins/llm). No LibTorch.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "refit/config.h"

namespace refit::text {

struct SplitOptions {
  std::string part = "train";                    // train | val | test
  std::vector<double> fractions{0.8, 0.1, 0.1};  // of the records, in this order
  std::uint64_t seed = 0;
  bool seed_given = false;  // else the run's /training/seed (for_run)
  bool enabled = false;     // no "split": every record
  static SplitOptions from_config(const ConfigReader& c);
  /// For a run whose /training/seed is `run_seed`: the seed, unless the config gives one.
  SplitOptions for_run(std::uint64_t run_seed) const {
    SplitOptions s = *this;
    if (!seed_given) s.seed = run_seed;
    return s;
  }
};

/// The records' indices of `part`: a seeded shuffle (Fisher–Yates on mt19937_64) cut at the
/// rounded cumulative fractions; the parts are disjoint and cover every index.
std::vector<std::size_t> split_indices(std::size_t n, const SplitOptions& split);

}  // namespace refit::text
