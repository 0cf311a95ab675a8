#pragma once
// `refit generate RECIPE [--prompts FILE|-] [--out FILE]`: text from a decoder language model of
// the recipe (with its trained adapters from a checkpoint, or --checkpoint none for the recipe's
// own weights), prompts rendered with the tokenizer's chat template, decoded with a KV cache in
// batches: greedy, or sampled (temperature, top-k, top-p) from a seeded generator; each
// completion ends at EOS, at a stop string or after max_new_tokens. Without --out the
// completions stream to the terminal as they are decoded.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "run/assembly.h"

namespace refit::cli {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax)
  std::int64_t top_k = 0;    // 0: every token
  double top_p = 1.0;        // 1: every token
  std::uint64_t seed = 0;
};

struct GenerateOptions {
  std::optional<std::filesystem::path> checkpoint;  // default: the run's latest; "none": the recipe's weights
  std::string prompts = "-";                        // a JSONL file, or "-": standard input
  std::optional<std::filesystem::path> out;         // JSONL; none: stream to the terminal
  std::string model;                                // default: the objective's last model
  std::string tokenizer;                            // default: /data/train/config/tokenizer
  std::int64_t max_new_tokens = 128;
  std::vector<std::string> stop;
  SamplingOptions sampling;
  std::int64_t batch_size = 8;
  bool chat_template = true;  // false: prompts are tokenized as they are
  std::optional<std::string> system;
};

/// Chooses the next token of each row from its last-position logits [B, V] (float32): greedy,
/// or HF's order of warpers — temperature, then top-k, then top-p (the smallest set of tokens
/// whose probability reaches p, at least one) — and a draw from `generator`.
torch::Tensor next_tokens(const torch::Tensor& logits, const SamplingOptions& options, at::Generator& generator);

struct GenerateSummary {
  std::int64_t prompts = 0, tokens = 0;
  double seconds = 0;
};

GenerateSummary generate(Assembly& assembly, const GenerateOptions& options, std::FILE* out);

}  // namespace refit::cli
