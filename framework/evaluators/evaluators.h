#pragma once
// The built-in evaluators: "knn" (DINO's weighted k-NN accuracy) and "linear_probe" (logistic
// regression on frozen features). See docs/evaluation.md.
#include <cstdint>

#include <torch/types.h>

#include "refit/registry.h"

namespace refit {

/// Registers "knn" and "linear_probe" in registry.evaluators.
void register_builtin_evaluators(Registry& registry);

/// DINO's weighted k-NN vote (facebookresearch/dino, eval_knn.py knn_classifier): features are
/// L2-normalised, each query's k most similar bank samples (cosine similarity) vote for their
/// class with weight exp(similarity / temperature), and the class with the largest total wins.
/// `bank` [N, D], `bank_labels` [N] int64 in [0, num_classes), `queries` [Q, D]; returns the
/// predicted classes [Q] int64, on the queries' device. Queries are processed `chunk` at a time
/// (0: chosen to bound the similarity and vote buffers to about 64 Mi elements).
torch::Tensor knn_predict(const torch::Tensor& bank, const torch::Tensor& bank_labels, const torch::Tensor& queries,
                          std::int64_t k, double temperature, std::int64_t num_classes, std::int64_t chunk = 0);

}  // namespace refit
