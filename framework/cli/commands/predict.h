#pragma once
// `refit predict RECIPE --input SPEC --out FILE`: the trained model run on inputs, its
// predictions written one line per input, in input order.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "run/assembly.h"

namespace refit::cli {

struct PredictOptions {
  /// Trained weights (default: the run's latest checkpoint; "none": the recipe's own weights).
  std::optional<std::filesystem::path> checkpoint;
  /// What to predict on: "data:train", "data:val", "data:test", "sets:NAME" (the recipe's data),
  /// or a dataset component: a JSON file `{"type": ..., "config": {...}}` or that JSON inline —
  /// any dataset type the recipe's plugins register (text_csv, text_jsonl, csv, image_folder, ...).
  std::string input;
  /// Where: `.jsonl` (one JSON object a line) or `.csv`.
  std::filesystem::path out;
  /// The models run in order (default: the objective's, e.g. classification's "models").
  std::vector<std::string> models;
  /// Named model outputs written besides the prediction ("features", "logits"; "model/field"
  /// for one model's).
  std::vector<std::string> outputs;
  /// Classes written per input with their probabilities; 0: no class columns at all (an
  /// embedding model, whose main output is no class scores).
  std::int64_t top_k = 5;
  std::int64_t batch_size = 0;  // 0: /training/batch_size
};

struct PredictSummary {
  std::int64_t count = 0;
  double seconds = 0;
  std::optional<double> accuracy;  // when the inputs carry labels and the last output is class scores
};

/// Restores the checkpoint's trainable weights, runs the models on every input in input order
/// under the recipe's precision (eval mode, no grad) and writes, per input: "id" (its index),
/// "predicted" (the class with the largest score), "class" (its name, when the classes have
/// names) and "top_k" ([[class, probability(, name)], ...], a softmax of the last model's main
/// output) when that output is one score vector per input, "label" when the input has one, and
/// each requested output. The file appears whole when every input succeeded, or not at all.
/// Under torchrun the ranks take turns by batch and rank 0 writes the same file. Progress and
/// throughput go to `progress` (rank 0's).
PredictSummary predict(Assembly& assembly, const PredictOptions& options, std::FILE* progress);

}  // namespace refit::cli
