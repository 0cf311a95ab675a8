#pragma once
// A tokenizer as the text datasets, chat templates and generation see it: text to ids and back,
// nothing model-specific. Implementations: the byte-level BPE tokenizer (Llama, Qwen2, SmolLM2,
// GPT-2; plugins/text/byte_bpe.h) and BERT's WordPiece (plugins/text/wordpiece_tokenizer.h).
// No LibTorch: ids are plain int64 vectors.
//
// Thread safety: implementations are immutable once constructed; every member may be called from
// any number of threads at once.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace refit {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// The ids of `text`. With add_special_tokens the tokenizer's post-processing applies (BOS/EOS
  /// or [CLS]/[SEP], as the tokenizer's files say); special tokens written in the text are matched
  /// either way.
  virtual std::vector<std::int64_t> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  /// The text of `ids`; with skip_special_tokens the special tokens are left out.
  virtual std::string decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens = false) const = 0;

  /// The id of a token (as the vocabulary spells it), or nullopt.
  virtual std::optional<std::int64_t> token_to_id(std::string_view token) const = 0;
  /// The token with an id (as the vocabulary spells it), or nullopt outside the vocabulary.
  virtual std::optional<std::string> id_to_token(std::int64_t id) const = 0;
  /// Number of ids, added tokens included.
  virtual std::size_t vocab_size() const = 0;

  /// The exact bytes an id stands for, where the tokenizer's pieces concatenate to the text
  /// (byte-level BPE: decode() is these bytes laid end to end, repaired as UTF-8); nullopt for a
  /// tokenizer that does not keep the text (WordPiece lower-cases, drops spaces).
  virtual std::optional<std::string> token_bytes(std::int64_t /*id*/) const { return std::nullopt; }

  virtual std::optional<std::int64_t> bos_id() const = 0;
  virtual std::optional<std::int64_t> eos_id() const = 0;
  virtual std::optional<std::int64_t> pad_id() const = 0;
};

}  // namespace refit
