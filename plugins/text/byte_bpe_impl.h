// The inside of ByteBpeTokenizer (byte_bpe.h), shared by its constructors (byte_bpe_json.cpp,
// byte_bpe_gguf.cpp) and the encoder (byte_bpe.cpp). Not installed.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "byte_bpe.h"
#include "byte_bpe_split.h"

namespace refit::text::bpe {

/// GPT-2's bytes_to_unicode: byte -> code point (all below U+0144) and back (-1: not a byte's).
struct ByteMap {
  std::array<char32_t, 256> to_char;
  std::array<std::int16_t, 512> from_char;
  ByteMap() { from_char.fill(-1); }
};
const ByteMap& byte_map();
void append_utf8(std::string& out, char32_t c);
/// A token spelled in the byte alphabet as its raw bytes; nullopt if any character is outside it.
std::optional<std::string> token_to_raw(std::string_view token);
/// Raw bytes spelled in the byte alphabet.
std::string raw_to_token(std::string_view raw);

struct AddedToken {
  std::string content;
  std::string pattern;  // what is matched: the content, or its normalised form when normalized
  std::int64_t id = -1;
  bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

struct AddedMatcher {
  std::array<std::vector<std::uint32_t>, 256> by_first_byte;  // indices into Impl::added, longest first
  bool any = false;
};

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreStep {
  enum class Kind { split, digits } kind = Kind::split;
  std::shared_ptr<const Splitter> splitter;  // split
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool individual_digits = false;  // digits
};

enum class Decoder { none, byte_level };

struct MergeEntry {
  std::int32_t a, b, new_id;
  std::uint32_t rank;
};

/// (id a, id b) -> (rank, merged id), open addressing.
struct MergeTable {
  struct Slot {
    std::uint64_t key = 0;
    std::uint32_t rank = 0;
    std::int32_t new_id = 0;
    bool used = false;
  };
  std::vector<Slot> slots;
  std::size_t mask = 0;

  static std::size_t hash(std::uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<std::size_t>(k);
  }
  void build(const std::vector<MergeEntry>& list);
  const Slot* find(std::int32_t a, std::int32_t b) const {
    const std::uint64_t key =
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s;
    }
  }
};

struct Impl {
  std::string label;  // the file, for errors

  // The model.
  std::unordered_map<std::string, std::int64_t> vocab;      // token (byte alphabet) -> id
  std::unordered_map<std::string, std::int32_t> raw_vocab;  // the same by raw bytes (ignore_merges)
  std::array<std::int32_t, 256> byte_id{};                  // each byte's token, -1 if none
  std::vector<MergeEntry> merge_list;                       // until finish()
  MergeTable merges;
  bool ignore_merges = false;
  std::optional<std::string> unk_token;
  std::optional<std::int64_t> unk_id;
  bool fuse_unk = false;

  // Added tokens, in the order added; ids after the model's.
  std::vector<AddedToken> added;
  std::unordered_map<std::string, std::int64_t> added_ids;
  std::int64_t next_added_id = 0;
  AddedMatcher raw_matcher, normalized_matcher;

  bool nfc = false;
  std::vector<PreStep> steps;  // before ByteLevel
  bool add_prefix_space = false;
  std::shared_ptr<const Splitter> gpt2;  // ByteLevel's use_regex, or null
  Decoder decoder = Decoder::byte_level;
  std::vector<std::int64_t> prefix_ids, suffix_ids;  // the post-processor, single sequence
  std::optional<std::int64_t> bos, eos, pad;

  // Per id (finish()).
  std::size_t id_count = 0;
  std::vector<std::string> id_token;  // as the vocabulary spells it (added tokens: their content)
  std::vector<std::string> id_bytes;  // what the decoder makes of it
  std::vector<std::uint8_t> id_known, id_special;
  std::uint64_t cache_id = 0;

  /// Adds a token as AddedVocabulary::add_tokens does; returns its id (-1 for empty content).
  std::int64_t add_token(AddedToken a);
  /// Builds the lookup tables once everything is read.
  void finish(const std::string& where);

  std::string normalize(std::string_view s) const;
  template <class Emit>
  void for_each_piece(std::string_view text, Emit&& emit) const;
  template <class Emit>
  void split_added(const AddedMatcher& mt, std::string_view s, Emit& emit) const;
  template <class Emit>
  void run_steps(std::size_t step, std::string_view piece, Emit& emit) const;
  void bpe_piece(std::string_view raw, std::vector<std::int64_t>& out) const;
  void merge_word(std::string_view raw, std::vector<std::int32_t>& out) const;
};

}  // namespace refit::text::bpe
