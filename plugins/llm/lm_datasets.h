#pragma once
// Datasets for causal-LM fine-tuning (plugin "llm"). Every record becomes a TokenizedSample
// (lm_samples.h) when the dataset is built — tokenized once, in order — and the samples of one
// split are optionally packed. Fields: "input_ids" (padded with the tokenizer's pad id),
// "labels" (padded with -100), their mask "attention_mask", "position_ids" and "segment_ids"
// (padded with 0; an unpacked sample is one segment at positions 0..n-1), which the llama model
// configured with "packed": true reads for its block-causal mask.
//
//   "chat_jsonl":        {"messages": [{"role": "system" | "user" | "assistant", "content": ...}]}
//                        per line, rendered with the tokenizer's chat template
//   "prompt_completion_jsonl": {"prompt": ..., "completion": ...} per line: a user turn and an
//                        assistant turn of the chat template, or with "template": "none" the
//                        plain text prompt + completion + EOS (loss on the completion and EOS)
//   "text":              a plain text file for continued pretraining: one document per line or
//                        per blank-line-separated paragraph ("documents": "lines" | "paragraphs"),
//                        each followed by EOS, every token trained, long ones cut into
//                        max_length pieces
//   "wordnet":           Debian wordnet-base's glosses as chat pairs (wordnet.h)
//
// Shared keys: "tokenizer" (a .gguf file, a tokenizer.json, or a folder holding tokenizer.json),
// "chat_template" (template text overriding the tokenizer's), "system" (a system message put
// before every conversation that has none), "max_length" (512; longer samples are cut),
// "loss_mask" (train_on_assistant | train_on_last | train_on_all), "packing" (false), "split"
// (as the text datasets: seeded train/val/test parts), "limit" (the first N records of the part).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llm/lm_samples.h"
#include "refit/config.h"
#include "refit/dataset.h"
#include "refit/registry.h"
#include "text/open_tokenizer.h"
#include "text/split.h"

namespace refit::llm {

struct LmDataOptions {
  std::string tokenizer;
  std::optional<std::string> chat_template;
  std::optional<std::string> system;
  std::int64_t max_length = 512;
  text::LossMask loss_mask = text::LossMask::train_on_assistant;
  bool packing = false;
  text::SplitOptions split;
  std::optional<std::int64_t> limit;
  static LmDataOptions from_config(const ConfigReader& c);
  /// For a run whose /training/seed is `run_seed`: the split's seed, unless the config gives one.
  LmDataOptions for_run(std::uint64_t run_seed) const;
};

/// Chat -> sample: render with the template, tokenize with byte offsets, label the tokens that
/// overlap the mask's assistant spans (lm_samples.h: labels_from_spans), cut at max_length.
TokenizedSample tokenize_chat(const text::LmTokenizer& tokenizer, const text::Conversation& messages, text::LossMask mask,
                              std::size_t max_length);

class LmDataset : public Dataset {
 public:
  LmDataset(std::string name, std::vector<TokenizedSample> samples, std::shared_ptr<const text::LmTokenizer> tokenizer,
            std::int64_t max_length, bool packing, std::size_t records);
  std::int64_t size() const override;
  std::vector<FieldInfo> fields() const override;
  Example get(std::int64_t index) const override;
  std::string describe() const override;
  /// Tokens with a loss over the whole dataset.
  std::size_t target_tokens() const { return targets_; }

 private:
  std::string name_;
  std::vector<TokenizedSample> samples_;  // unpacked
  std::vector<PackedSequence> packs_;     // packed
  std::shared_ptr<const text::LmTokenizer> tokenizer_;
  std::int64_t pad_id_ = 0;
  bool packing_;
  std::size_t records_, targets_ = 0;
  PackingStats packing_stats_;
};

/// The datasets above, by type, for the plugin's registration.
void register_lm_datasets(Registry& registry);

}  // namespace refit::llm
