// Byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2), id for id as Hugging Face's `tokenizers`
// runs it: added/special tokens split out of the raw text first (leftmost-longest, lstrip /
// rstrip / single_word / normalized as tokenizers applies them), an optional NFC normaliser, the
// pre-tokenizer sequence (Split by a regex or string with any split behaviour, Digits, ByteLevel
// with or without the GPT-2 regex), GPT-2's byte-to-unicode map, merges by rank, the template
// post-processor, and the ByteLevel decoder (bytes concatenated, invalid UTF-8 replaced by U+FFFD
// per maximal invalid subpart). Regexes run on ICU (they need lookahead); the GPT-2, Llama-3 and
// Qwen2 patterns run on hand-written matchers that give the same pieces (tested against ICU).
// See docs/text.md.
//
// Thread safety: a constructed tokenizer is immutable; every const member may be called from any
// number of threads at once (the word cache is per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "refit/tokenizer.h"

namespace refit::io {
class GgufFile;
}

namespace refit::text {
namespace bpe {
struct Impl;  // byte_bpe_impl.h
}

/// Where a GGUF's `tokenizer.ggml.pre` split comes from, for the names on which the two
/// references disagree ("smollm", "starcoder", ... : llama.cpp splits digits one by one, as the
/// models' own tokenizer.json did; transformers' GGUF loader uses the plain GPT-2 regex).
enum class GgufPreTokenizer {
  transformers,  ///< the tokenizer `AutoTokenizer.from_pretrained(dir, gguf_file=...)` builds (default)
  llama_cpp,     ///< llama.cpp's split
};

/// Incremental UTF-8 repair: feed bytes in any pieces; each call returns the text that is complete
/// so far (a character cut at the end of a piece waits for the next), finish() returns the rest.
/// The concatenated output equals String::from_utf8_lossy / Python's decode("utf-8", "replace")
/// of all bytes at once: one U+FFFD per maximal invalid subpart.
class Utf8StreamRepair {
 public:
  std::string feed(std::string_view bytes);
  std::string finish();

 private:
  unsigned char pending_[4] = {};
  int npending_ = 0;
};

/// `bytes` with every maximal invalid UTF-8 subpart replaced by U+FFFD.
std::string repair_utf8(std::string_view bytes);

class ByteBpeTokenizer final : public refit::Tokenizer {
 public:
  /// Reads a `tokenizer.json` (model BPE; normalizer none or NFC; pre-tokenizer Split / Digits /
  /// ByteLevel or a Sequence of them ending in ByteLevel; decoder ByteLevel or none; post-processor
  /// TemplateProcessing, ByteLevel or a Sequence of them). Anything else, and any malformed value,
  /// is a refit::Error naming the file and the JSON pointer.
  static ByteBpeTokenizer from_tokenizer_json(const std::string& path);
  /// The same from the file's text; `label` names it in errors.
  static ByteBpeTokenizer from_tokenizer_json_text(std::string_view json, const std::string& label);
  /// The tokenizer embedded in a GGUF file (`tokenizer.ggml.model` "gpt2"): tokens, merges,
  /// token types (3 control -> special added token, 4 user-defined -> added token), bos / eos /
  /// padding ids, add_bos_token / add_eos_token, and the split `tokenizer.ggml.pre` names (an unknown
  /// name is refused). Defined in byte_bpe_gguf.cpp (links refit_gguf).
  static ByteBpeTokenizer from_gguf(const refit::io::GgufFile& file, GgufPreTokenizer pre = GgufPreTokenizer::transformers);

  /// What from_gguf reads, for callers that hold the values some other way; `label` names the
  /// source in errors.
  struct GgufVocabulary {
    std::string label;
    std::string model;  ///< tokenizer.ggml.model
    std::string pre;    ///< tokenizer.ggml.pre ("" when absent: "default")
    std::vector<std::string> tokens;
    std::vector<std::string> merges;
    std::vector<std::int64_t> token_types;  ///< empty when absent
    std::optional<std::int64_t> bos, eos, unk, pad;
    bool add_bos = false, add_eos = false;
  };
  static ByteBpeTokenizer from_gguf_vocabulary(const GgufVocabulary& v,
                                               GgufPreTokenizer pre = GgufPreTokenizer::transformers);

  // ---- refit::Tokenizer ----
  /// Input that is not valid UTF-8 is read as `repair_utf8(text)` (tokenizers takes only valid
  /// strings; Python callers get there with decode("utf-8", "replace")).
  std::vector<std::int64_t> encode(std::string_view text, bool add_special_tokens = true) const override;
  /// Ids outside the vocabulary are skipped (as tokenizers does).
  std::string decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens = false) const override;
  std::optional<std::int64_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(std::int64_t id) const override;
  std::size_t vocab_size() const override;
  std::optional<std::int64_t> bos_id() const override;
  std::optional<std::int64_t> eos_id() const override;
  std::optional<std::int64_t> pad_id() const override;

  /// Decodes a stream of ids one at a time (generation): push() returns the text that is complete
  /// after this id, finish() the rest; together they equal decode() of all the ids.
  class StreamDecoder {
   public:
    std::string push(std::int64_t id);
    std::string finish() { return repair_.finish(); }

   private:
    friend class ByteBpeTokenizer;
    StreamDecoder(const ByteBpeTokenizer* t, bool skip) : tok_(t), skip_special_(skip) {}
    const ByteBpeTokenizer* tok_;
    bool skip_special_;
    bool first_ = true;  // no decoder: a space goes before every piece but the first
    Utf8StreamRepair repair_;
  };
  /// The decoder borrows this tokenizer, which must outlive it.
  StreamDecoder stream_decoder(bool skip_special_tokens = false) const { return StreamDecoder(this, skip_special_tokens); }

  /// The pieces BPE sees (raw UTF-8, after added tokens, normalisation and pre-tokenisation, before
  /// the byte map); an added token is a piece of its own. For tests and debugging.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  /// Whether an id is a special added token (skip_special_tokens leaves it out).
  bool is_special(std::int64_t id) const;
  /// The bytes an id decodes to (nullopt outside the vocabulary).
  std::optional<std::string> token_bytes(std::int64_t id) const override;

 private:
  explicit ByteBpeTokenizer(std::shared_ptr<const bpe::Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const bpe::Impl> impl_;
};

}  // namespace refit::text
