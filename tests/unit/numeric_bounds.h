#pragma once
// Tolerances of the golden tests, derived from the arithmetic rather than fitted to a machine.
//
// Every rounding of a result to a floating type t satisfies fl(v) = v (1 + d), |d| <= u_t (the
// unit roundoff: bf16 2^-8, fp16 2^-11, fp32 2^-24, fp64 2^-53). A value computed by a chain of
// at most n roundings (a dot product of length K is n = K, in any summation order, with or
// without FMA: Higham, "Accuracy and Stability of Numerical Algorithms", 3.1 and 3.5) from exact
// inputs through sums and products only satisfies
//     |computed - exact| <= gamma_n * P(|inputs|),     gamma_n = n u / (1 - n u),
// where P(|inputs|) is the same computation run on the absolute values of the inputs, with every
// subtraction turned into an addition (for products and sums of non-negative numbers: the same
// ops on |inputs|). This holds for any order and blocking of the reductions, so for any CPU,
// thread count or kernel; two such computations (refit's and the Python reference's, each on
// its own CPU) differ by at most twice the bound. The exact value is computed in the test in
// double (its own error is gamma_n(2^-53) * P, added to the bound).
//
// n is the depth of the computation: the sum of the reduction lengths and of the elementwise
// roundings along the longest path from an input to the output (an upper bound on the path's
// roundings; no path is longer than all of them together).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "test_support.h"  // Catch, after c10's logging macros

namespace refit::test {

/// Unit roundoff u = 2^-p (p: the significand's bits, the implicit one included).
constexpr double kUnitBf16 = 1.0 / (1 << 8);            // 2^-8
constexpr double kUnitFp16 = 1.0 / (1 << 11);           // 2^-11
constexpr double kUnitFp32 = 1.0 / (1 << 24);           // 2^-24
constexpr double kUnitFp64 = 1.0 / 9007199254740992.0;  // 2^-53

inline double unit_roundoff(c10::ScalarType t) {
  switch (t) {
    case torch::kBFloat16: return kUnitBf16;
    case torch::kHalf: return kUnitFp16;
    case torch::kFloat: return kUnitFp32;
    case torch::kDouble: return kUnitFp64;
    default: throw std::invalid_argument("unit_roundoff: not a floating type");
  }
}

/// gamma_n = n u / (1 - n u): the relative bound of n roundings in a row (n u < 1).
inline double gamma_n(std::int64_t n, double u) {
  const double nu = static_cast<double>(n) * u;
  if (!(nu < 1)) throw std::invalid_argument("gamma: n u >= 1, no bound");
  return nu / (1 - nu);
}

/// The relative bound of an fp32 dot product of length K (relative to sum |a_i b_i|).
inline double fp32_dot_bound(std::int64_t K) { return gamma_n(K, kUnitFp32); }

/// The bound of one computation in type `t` of depth n relative to P(|inputs|), plus the error
/// of the double reference it is compared with (the same depth in fp64).
inline double depth_bound(std::int64_t n, c10::ScalarType t) { return gamma_n(n, unit_roundoff(t)) + gamma_n(n, kUnitFp64); }

/// max over elements of |a - ref| / bound (bound elementwise, broadcastable): <= 1 passes. An
/// element with bound 0 passes only when it is exact.
inline double bound_ratio(const torch::Tensor& a, const torch::Tensor& ref, const torch::Tensor& bound) {
  TORCH_CHECK(a.sizes() == ref.sizes(), "bound_ratio: shapes differ");
  const auto d = (a.to(torch::kDouble) - ref.to(torch::kDouble)).abs();
  return (d / bound.to(torch::kDouble).clamp_min(DBL_MIN)).max().item<double>();
}

// ---- Probabilistic bounds ----------------------------------------------------------------------
// The worst-case gamma_n assumes every rounding error has the largest size and the same sign; for
// a deep net (n in the hundreds to hundreds of thousands) it is a hundred times the error any CPU
// makes and cannot see a real bug (a LayerNorm epsilon, a missing term). Modelled as random
// (Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci.
// Comput. 41(5), 2019): each rounding error delta_k has |delta_k| <= u and mean zero given the
// roundings before it. The first-order error of a result is then sum_k delta_k s_k (s_k: the
// magnitude that rounding k scales on its way to the result, |s_k| <= P(|inputs|)), a martingale
// with increments bounded by u |s_k|, and the Azuma-Hoeffding inequality gives
//     |computed - exact| <= lambda u sqrt(sum_k s_k^2) <= lambda sqrt(n) u P(|inputs|)
// with probability at least 1 - 2 exp(-lambda^2 / 2) per value. kLambda = 5 puts that at
// 7.5e-6. gamma~_n = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1 (Higham and Mary's form) adds
// the second-order terms. The constant is fixed here, never fitted to a measured error.
constexpr double kLambda = 5;

/// gamma~_n(kLambda), the probabilistic counterpart of gamma_n, or gamma_n itself where that is
/// smaller (n < kLambda^2 = 25: the worst case always holds).
inline double prob_gamma(std::int64_t n, double u) {
  if (n <= 0) return 0;
  const double nd = static_cast<double>(n);
  const double probabilistic = std::expm1(kLambda * std::sqrt(nd) * u + nd * u * u / (1 - u));
  return nd * u < 1 ? std::min(probabilistic, gamma_n(n, u)) : probabilistic;
}

/// The probabilistic bound of one computation in type `t` of depth n relative to P(|inputs|),
/// plus the double reference's own (worst-case) error.
inline double prob_depth_bound(std::int64_t n, c10::ScalarType t) {
  return prob_gamma(n, unit_roundoff(t)) + gamma_n(n, kUnitFp64);
}

// ---- The record of each golden check ---------------------------------------------------------

/// Appends "test<TAB>label<TAB>error / bound" to the file REFIT_BOUNDS_LOG names, if set:
/// scripts/golden_bounds.py runs the golden tests on this CPU, under the AVX2 emulation and under
/// the mutants, and builds docs/precision.md's table (bound vs measured vs mutant) from the logs.
inline void log_bound_ratio(const std::string& test, const std::string& label, double ratio) {
  const char* path = std::getenv("REFIT_BOUNDS_LOG");
  if (path == nullptr || *path == 0) return;
  std::ofstream out(path, std::ios::app);
  out << test << '\t' << label << '\t' << ratio << '\n';
}

/// A golden check: `ratio` (a measured error over its derived bound) must be at most 1. Logged
/// under the running test's name for the bounds table.
inline void check_bound_ratio(const std::string& label, double ratio) {
  log_bound_ratio(Catch::getResultCapture().getCurrentTestName(), label, ratio);  // first: a failure may abort
  INFO(label << ": error / bound " << ratio);
  CHECK(ratio <= 1);
}

/// The number of elements a reduction over `dims` of `t` sums (its length K).
inline std::int64_t reduction_length(const torch::Tensor& t, std::initializer_list<std::int64_t> dims) {
  std::int64_t k = 1;
  for (auto d : dims) k *= t.size(d);
  return k;
}

}  // namespace refit::test
