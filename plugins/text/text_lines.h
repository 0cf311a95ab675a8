#pragma once
// "text_lines": a plain text file, one input per line, read lazily — for `refit predict` on
// inputs of any length. Building it scans the file once and keeps only where each line starts
// (8 bytes a line); a sample reads its line from the file (pread: safe from the loader's worker
// threads) and tokenizes it then. No labels: every sample has "input_ids", "token_type_ids"
// (padded per batch; mask "attention_mask"). Config: "tokenizer", "file", "max_length" (128).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/dataset.h"
#include "text/wordpiece.h"

namespace refit::text {

class TextLines : public Dataset {
 public:
  TextLines(const std::string& file, std::shared_ptr<const WordPieceTokenizer> tokenizer, std::int64_t max_length,
            std::string max_length_from = "");
  ~TextLines() override;
  std::int64_t size() const override { return static_cast<std::int64_t>(starts_.size()) - 1; }
  std::vector<FieldInfo> fields() const override;
  Example get(std::int64_t index) const override;
  std::string describe() const override;
  /// Line `index` (1-based in messages), without its line break.
  std::string line(std::int64_t index) const;

 private:
  std::string file_;
  int fd_ = -1;
  std::vector<std::uint64_t> starts_;  // line i is [starts_[i], starts_[i + 1]) including its '\n'
  std::shared_ptr<const WordPieceTokenizer> tokenizer_;
  std::int64_t max_length_;
  std::string max_length_from_;
};

}  // namespace refit::text
