#pragma once
// The one seeded shuffle refit and its plugins use (data order, dataset splits, probes).
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace refit {

/// Fisher-Yates on mt19937_64: from the last position down, swap with a position drawn as
/// rng() % (i + 1). Written out because std::shuffle's algorithm is implementation-defined: the
/// same seed must give the same order with every standard library, or a recipe's split and its
/// resumed data order would change with the compiler.
template <class T>
void seeded_shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<std::size_t>(rng() % i)]);
}

}  // namespace refit
