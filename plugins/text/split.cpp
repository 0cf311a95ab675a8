#include "text/split.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "refit/shuffle.h"

namespace refit::text {

SplitOptions SplitOptions::from_config(const ConfigReader& c) {
  SplitOptions s;
  if (!c.has("split")) return s;
  ConfigReader r = c.child("split");
  s.enabled = true;
  s.part = r.choice("part", {"train", "val", "test"}, s.part);
  s.fractions = r.optional<std::vector<double>>("fractions", s.fractions);
  s.seed_given = r.has("seed");
  s.seed = r.optional<std::uint64_t>("seed", s.seed);
  double total = 0;
  for (double f : s.fractions) total += f;
  if (s.fractions.size() != 3 || std::any_of(s.fractions.begin(), s.fractions.end(), [](double f) { return f < 0; }) ||
      std::abs(total - 1.0) > 1e-9)
    r.error("fractions", "expected three non-negative fractions [train, val, test] that add up to 1");
  return s;
}

std::vector<std::size_t> split_indices(std::size_t n, const SplitOptions& split) {
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  if (!split.enabled) return order;
  std::mt19937_64 rng(split.seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL);
  seeded_shuffle(order, rng);
  const auto train_end = static_cast<std::size_t>(std::llround(split.fractions[0] * static_cast<double>(n)));
  const auto val_end =
      std::min(n,
               static_cast<std::size_t>(std::llround((split.fractions[0] + split.fractions[1]) * static_cast<double>(n))));
  const std::size_t begin = split.part == "train" ? 0 : split.part == "val" ? train_end : val_end;
  const std::size_t end = split.part == "train" ? train_end : split.part == "val" ? val_end : n;
  return std::vector<std::size_t>(order.begin() + static_cast<std::ptrdiff_t>(std::min(begin, n)),
                                  order.begin() + static_cast<std::ptrdiff_t>(std::min(end, n)));
}

}  // namespace refit::text
