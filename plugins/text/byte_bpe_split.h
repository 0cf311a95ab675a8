// The regex splits of byte-level BPE pre-tokenizers, as `tokenizers` finds them with Oniguruma:
// the non-overlapping matches of a pattern, left to right, an empty match right after the previous
// match skipped. General patterns run on ICU's regex engine (lookahead, Unicode properties) after
// translating the few Oniguruma escapes whose meaning differs in ICU. The GPT-2, Llama-3 and Qwen2
// patterns - nearly every byte-level model's - run on hand-written matchers that give the same
// pieces in a single pass (tests/unit/test_byte_bpe.cpp compares them with the ICU engine).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace refit::text::bpe {

struct Match {
  std::uint32_t start, end;  // byte offsets, end exclusive
};

class Splitter {
 public:
  virtual ~Splitter() = default;
  /// Appends the matches in `s` (valid UTF-8) to `out`. Throws refit::Error when the engine gives
  /// up (a pattern that backtracks past the time limit).
  virtual void find(std::string_view s, std::vector<Match>& out) const = 0;
};

/// GPT-2's pattern (the ByteLevel pre-tokenizer's `use_regex`).
extern const char* const kGpt2Pattern;
/// Llama 3's (digits in groups of up to three) and Qwen2's (single digits).
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;

/// A splitter for an Oniguruma pattern: the hand-written matcher for the three patterns above
/// (unless force_icu), otherwise ICU's engine. Throws std::invalid_argument with ICU's reason and
/// the offset for a pattern ICU cannot compile.
std::unique_ptr<Splitter> make_regex_splitter(const std::string& pattern, bool force_icu = false);
/// A splitter for a literal string (Split's {"String": ...} pattern).
std::unique_ptr<Splitter> make_literal_splitter(const std::string& literal);

/// The pattern as ICU reads it: Oniguruma's \s \S (White_Space), \w \W, \h \H (hex digits) and `.`
/// (everything but \n) spelled out, ^ and $ matching at line ends (Ruby syntax).
std::string onig_to_icu(const std::string& pattern);

/// Unicode classes the patterns use: letter (L*), number (N*), White_Space, other.
enum class CharClass : std::uint8_t { letter, number, space, other };
CharClass char_class(char32_t c);

/// Decodes the code point at s[i] (valid UTF-8) and advances i.
inline char32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t c = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    i += 2;
    return c;
  }
  if (b0 < 0xF0) {
    const char32_t c = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
                       (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
    i += 3;
    return c;
  }
  const char32_t c = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
                     ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  i += 4;
  return c;
}

}  // namespace refit::text::bpe
