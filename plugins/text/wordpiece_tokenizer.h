// BERT's WordPiece tokenizer (wordpiece.h) behind the SDK's tokenizer interface (refit/tokenizer.h),
// so code written against refit::Tokenizer takes it as it takes byte-level BPE. encode() with
// add_special_tokens is [CLS] text [SEP]; decode() is tokenizers' WordPiece decoder (pieces joined
// with spaces, "##" continuations glued on, cleanup of " ." " ," " 's" ... as BERT's tokenizer.json
// sets it), leaving out the special tokens on request.
#pragma once

#include <memory>

#include "refit/tokenizer.h"
#include "text/wordpiece.h"

namespace refit::text {

class WordPieceAdapter final : public refit::Tokenizer {
 public:
  explicit WordPieceAdapter(std::shared_ptr<const WordPieceTokenizer> tokenizer);

  std::vector<std::int64_t> encode(std::string_view text, bool add_special_tokens = true) const override;
  std::string decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens = false) const override;
  std::optional<std::int64_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(std::int64_t id) const override;
  std::size_t vocab_size() const override { return tokenizer_->vocab_size(); }
  /// [CLS] and [SEP] play BOS and EOS for a BERT encoder.
  std::optional<std::int64_t> bos_id() const override { return tokenizer_->cls_id(); }
  std::optional<std::int64_t> eos_id() const override { return tokenizer_->sep_id(); }
  std::optional<std::int64_t> pad_id() const override;

  const WordPieceTokenizer& wordpiece() const { return *tokenizer_; }

 private:
  std::shared_ptr<const WordPieceTokenizer> tokenizer_;
  std::vector<std::int64_t> special_ids_;  // sorted
};

}  // namespace refit::text
