// BERT's WordPiece tokenizer, token for token as Hugging Face's `tokenizers` (BertTokenizerFast)
// does it: special tokens matched in the raw text, BertNormalizer (clean text, CJK spacing,
// accent stripping, lower-casing), BertPreTokenizer (whitespace and punctuation), greedy
// longest-match-first WordPiece, [CLS] A [SEP] (B [SEP]) with token type ids, longest_first
// truncation. No LibTorch: ids come out as plain vectors. See docs/text.md.
//
// Thread safety: a constructed tokenizer is immutable; every const member may be called from any
// number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace refit::text {

/// What tokenizer_config.json / tokenizer.json say about a BERT tokenizer.
struct WordPieceConfig {
  bool clean_text = true;             ///< drop control characters, NUL and U+FFFD; whitespace -> ' '
  bool handle_chinese_chars = true;   ///< put spaces around CJK ideographs
  std::optional<bool> strip_accents;  ///< unset: follows `lowercase` (BERT's rule)
  bool lowercase = true;
  std::string unk_token = "[UNK]";
  std::string cls_token = "[CLS]";
  std::string sep_token = "[SEP]";
  std::string pad_token = "[PAD]";
  std::string mask_token = "[MASK]";
  std::string continuing_subword_prefix = "##";
  std::size_t max_input_chars_per_word = 100;  ///< longer words become unk_token
  std::size_t model_max_length = 512;
  /// Tokens matched verbatim in the raw text before normalisation (HF's added tokens with
  /// normalized=false); each must be in the vocabulary. Longest match wins at a position.
  std::vector<std::string> special_tokens;
};

/// One encoded sequence or pair; the three vectors have the same length.
struct Encoding {
  std::vector<std::int64_t> input_ids;
  std::vector<std::int64_t> token_type_ids;  ///< 0 for [CLS] A [SEP], 1 for B [SEP]
  std::vector<std::int64_t> attention_mask;  ///< all 1 (no padding here; the collate pads)
};

class WordPieceTokenizer {
 public:
  /// Reads vocab.txt and tokenizer_config.json, and tokenizer.json where present (WordPiece
  /// settings, added tokens; its normaliser must agree with tokenizer_config.json). Throws
  /// std::runtime_error naming the file on anything missing, malformed or unsupported.
  static WordPieceTokenizer from_directory(const std::string& dir);

  /// `vocab[i]` is the token with id i. Throws when a configured token is not in it.
  WordPieceTokenizer(std::vector<std::string> vocab, WordPieceConfig config);

  /// [CLS] text [SEP]. With max_length, at most that many ids in all (special tokens included).
  Encoding encode(std::string_view text, std::optional<std::size_t> max_length = std::nullopt) const;
  /// [CLS] a [SEP] b [SEP]; max_length truncates longest_first like HF.
  Encoding encode_pair(std::string_view a, std::string_view b, std::optional<std::size_t> max_length = std::nullopt) const;

  /// Word-piece ids of a text: no [CLS]/[SEP], no truncation.
  std::vector<std::int64_t> tokenize_ids(std::string_view text) const;
  /// The same as token strings.
  std::vector<std::string> tokenize(std::string_view text) const;
  /// The words WordPiece sees: normalised and split (special tokens as their own words).
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  /// Id of a token, or -1.
  std::int64_t token_to_id(std::string_view token) const;
  const std::string& id_to_token(std::int64_t id) const;
  std::size_t vocab_size() const { return vocab_.size(); }
  const WordPieceConfig& config() const { return config_; }
  std::int64_t cls_id() const { return cls_id_; }
  std::int64_t sep_id() const { return sep_id_; }
  std::int64_t pad_id() const { return pad_id_; }
  std::int64_t unk_id() const { return unk_id_; }
  std::int64_t mask_id() const { return mask_id_; }

 private:
  // Calls `word(utf8, special_id)` for every pre-token in order; special_id >= 0 for a special
  // token matched in the raw text.
  template <class F>
  void for_each_word(std::string_view text, F&& word) const;
  void wordpiece(std::string_view word, std::string& key, std::vector<std::int64_t>& out) const;
  std::int64_t required_id(const std::string& token, const char* what) const;

  std::vector<std::string> vocab_;
  std::unordered_map<std::string, std::int64_t> ids_;
  WordPieceConfig config_;
  bool strip_accents_ = true;
  std::size_t max_token_bytes_ = 0;                             // longest vocabulary entry without the ## prefix
  std::vector<std::pair<std::string, std::int64_t>> specials_;  // longest first
  std::int64_t cls_id_ = -1, sep_id_ = -1, pad_id_ = -1, unk_id_ = -1, mask_id_ = -1;
};

}  // namespace refit::text
