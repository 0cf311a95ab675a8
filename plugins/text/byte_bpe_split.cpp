// Regex splits for the byte-level BPE pre-tokenizers (byte_bpe_split.h).
#include "byte_bpe_split.h"

#include <array>
#include <stdexcept>

#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include "refit/error.h"

namespace refit::text::bpe {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// ---- character classes -------------------------------------------------------------------------

namespace {

CharClass classify_icu(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_isUWhiteSpace(cp)) return CharClass::space;  // Oniguruma's \s: the White_Space property
  switch (u_charType(cp)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER: return CharClass::letter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER: return CharClass::number;
    default: return CharClass::other;
  }
}

// The Basic Multilingual Plane in a table (64 KiB, built once): the splitters classify every
// character, and ICU's property lookups cost several times a table read.
const std::array<CharClass, 0x10000>& bmp_classes() {
  static const std::array<CharClass, 0x10000> table = [] {
    std::array<CharClass, 0x10000> t{};
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = classify_icu(c);
    return t;
  }();
  return table;
}

}  // namespace

CharClass char_class(char32_t c) { return c < 0x10000 ? bmp_classes()[c] : classify_icu(c); }

// ---- the hand-written matchers -------------------------------------------------------------------

namespace {

struct Cursor {
  std::string_view s;
  const std::array<CharClass, 0x10000>& bmp = bmp_classes();

  // Class, code point and byte length of the character at byte offset j (< s.size()).
  CharClass at(std::size_t j, char32_t& cp, std::size_t& len) const {
    std::size_t k = j;
    cp = next_code_point(s, k);
    len = k - j;
    return cp < 0x10000 ? bmp[cp] : classify_icu(cp);
  }
  CharClass cls(std::size_t j) const {
    char32_t cp;
    std::size_t len;
    return at(j, cp, len);
  }
  // End of the run of characters of class `c` starting at j.
  std::size_t run(std::size_t j, CharClass c) const {
    while (j < s.size()) {
      char32_t cp;
      std::size_t len;
      if (at(j, cp, len) != c) break;
      j += len;
    }
    return j;
  }
};

// `\s+(?!\S)|\s+` at i, a whitespace character: the run, less its last character when a non-space
// follows and the run has more than one (that one goes with the next piece).
std::size_t whitespace_end(const Cursor& cur, std::size_t i) {
  std::size_t j = i, last = i, count = 0;
  while (j < cur.s.size()) {
    char32_t cp;
    std::size_t len;
    if (cur.at(j, cp, len) != CharClass::space) break;
    last = j;
    j += len;
    ++count;
  }
  if (j == cur.s.size() || count < 2) return j;
  return last;
}

class Gpt2Splitter final : public Splitter {
 public:
  void find(std::string_view s, std::vector<Match>& out) const override {
    const Cursor cur{s};
    const std::size_t n = s.size();
    for (std::size_t i = 0; i < n;) {
      std::size_t end = i;
      char32_t c;
      std::size_t len;
      const CharClass k = cur.at(i, c, len);
      if (c == '\'' && i + 1 < n) {  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
        const char a = s[i + 1];
        const char b = i + 2 < n ? s[i + 2] : '\0';
        if (a == 's' || a == 't' || a == 'm' || a == 'd') end = i + 2;
        else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
          end = i + 3;
      }
      if (end == i) {
        if (c == ' ' && i + 1 < n) {  // ` ?X+` with the space
          const CharClass next = cur.cls(i + 1);
          if (next != CharClass::space) end = cur.run(i + 1, next);
        }
        if (end == i) end = k == CharClass::space ? whitespace_end(cur, i) : cur.run(i, k);
      }
      out.push_back({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(end)});
      i = end;
    }
  }
};

// Llama 3 (max_digits 3) and Qwen2 (1).
class Llama3Splitter final : public Splitter {
 public:
  explicit Llama3Splitter(int max_digits) : max_digits_(max_digits) {}

  void find(std::string_view s, std::vector<Match>& out) const override {
    const Cursor cur{s};
    const std::size_t n = s.size();
    for (std::size_t i = 0; i < n;) {
      out.push_back({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(match_at(cur, i))});
      i = out.back().end;
    }
  }

 private:
  static bool is(char32_t c, char lower) {
    return c == static_cast<char32_t>(lower) || c == static_cast<char32_t>(lower - 32);
  }

  // (?i:'s|'t|'re|'ve|'m|'ll|'d): case-insensitive as Oniguruma folds, so U+017F (long s) is an s.
  static std::size_t contraction(const Cursor& cur, std::size_t i) {
    const std::size_t n = cur.s.size();
    if (i + 1 >= n) return i;
    std::size_t j = i + 1;
    const char32_t a = next_code_point(cur.s, j);
    if (is(a, 's') || a == 0x17F || is(a, 't') || is(a, 'm') || is(a, 'd')) return j;
    if (j >= n) return i;
    std::size_t k = j;
    const char32_t b = next_code_point(cur.s, k);
    if ((is(a, 'r') && is(b, 'e')) || (is(a, 'v') && is(b, 'e')) || (is(a, 'l') && is(b, 'l'))) return k;
    return i;
  }

  std::size_t match_at(const Cursor& cur, std::size_t i) const {
    const std::size_t n = cur.s.size();
    char32_t c;
    std::size_t len;
    const CharClass k = cur.at(i, c, len);
    if (c == '\'') {
      const std::size_t e = contraction(cur, i);
      if (e != i) return e;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (k == CharClass::letter) return cur.run(i, k);
    if (k != CharClass::number && c != '\r' && c != '\n' && i + len < n && cur.cls(i + len) == CharClass::letter)
      return cur.run(i + len, CharClass::letter);
    // \p{N}{1,max}
    if (k == CharClass::number) {
      std::size_t j = i;
      for (int d = 0; d < max_digits_ && j < n; ++d) {
        char32_t cp;
        std::size_t l;
        if (cur.at(j, cp, l) != CharClass::number) break;
        j += l;
      }
      return j;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    std::size_t other_start = n;
    if (k == CharClass::other) other_start = i;
    else if (c == ' ' && i + 1 < n && cur.cls(i + 1) == CharClass::other)
      other_start = i + 1;
    if (other_start != n) {
      std::size_t j = cur.run(other_start, CharClass::other);
      while (j < n && (cur.s[j] == '\r' || cur.s[j] == '\n')) ++j;
      return j;
    }
    // k is whitespace. \s*[\r\n]+ : up to the run's last \r or \n.
    std::size_t j = i, last_newline = n;
    while (j < n) {
      char32_t cp;
      std::size_t l;
      if (cur.at(j, cp, l) != CharClass::space) break;
      if (cp == '\r' || cp == '\n') last_newline = j;
      j += l;
    }
    if (last_newline != n) return last_newline + 1;
    // \s+(?!\S)|\s+
    return whitespace_end(cur, i);
  }

  int max_digits_;
};

// ---- ICU ---------------------------------------------------------------------------------------

// ICU's "steps" are about a millisecond each, counted per match: a pathological pattern gives up
// after about a second on one pre-token instead of hanging the loader (no real pattern comes near).
constexpr int32_t kTimeLimitSteps = 1000;

class IcuSplitter final : public Splitter {
 public:
  IcuSplitter(const std::string& pattern, uint32_t flags) : source_(pattern) {
    UParseError pe{};
    UErrorCode st = U_ZERO_ERROR;
    const icu::UnicodeString p = icu::UnicodeString::fromUTF8(flags & UREGEX_LITERAL ? pattern : onig_to_icu(pattern));
    pattern_.reset(icu::RegexPattern::compile(p, flags, pe, st));
    if (U_FAILURE(st) || !pattern_)
      throw std::invalid_argument(std::string("the regex does not compile (") + u_errorName(st) + " at line " +
                                  std::to_string(pe.line) + ", offset " + std::to_string(pe.offset) + ")");
  }

  void find(std::string_view s, std::vector<Match>& out) const override {
    UErrorCode st = U_ZERO_ERROR;
    UText* text = utext_openUTF8(nullptr, s.data(), static_cast<int64_t>(s.size()), &st);
    struct Closer {
      UText* t;
      ~Closer() { utext_close(t); }
    } closer{text};
    std::unique_ptr<icu::RegexMatcher> m(pattern_->matcher(st));
    if (U_FAILURE(st) || !m) throw refit::Error(std::string("byte_bpe: ICU regex matcher: ") + u_errorName(st));
    m->reset(text);
    m->setTimeLimit(kTimeLimitSteps, st);
    int64_t last_end = -1;
    while (m->find(st)) {
      const int64_t a = m->start64(st), b = m->end64(st);
      // Oniguruma's find_iter skips an empty match right where the previous one ended.
      if (a == b && a == last_end) continue;
      out.push_back({static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(b)});
      last_end = b;
    }
    if (U_FAILURE(st))
      throw refit::Error("byte_bpe: the split regex " + source_ + " failed on a " + std::to_string(s.size()) +
                         "-byte piece (" + u_errorName(st) + ")");
  }

 private:
  std::string source_;
  std::unique_ptr<icu::RegexPattern> pattern_;
};

}  // namespace

std::string onig_to_icu(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '\\' || i + 1 == p.size()) {
      out += p[i];
      continue;
    }
    const char e = p[++i];
    switch (e) {
      case 's': out += "\\p{White_Space}"; break;
      case 'S': out += "\\P{White_Space}"; break;
      case 'w': out += "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]"; break;
      case 'W': out += "[^\\p{L}\\p{M}\\p{Nd}\\p{Pc}]"; break;
      case 'h': out += "[0-9a-fA-F]"; break;
      case 'H': out += "[^0-9a-fA-F]"; break;
      case 'Q': {  // \Q...\E: copied as it is
        const std::size_t e2 = p.find("\\E", i + 1);
        const std::size_t stop = e2 == std::string::npos ? p.size() : e2 + 2;
        out += p.substr(i - 1, stop - (i - 1));
        i = stop - 1;
        break;
      }
      default: out += '\\'; out += e;
    }
  }
  return out;
}

std::unique_ptr<Splitter> make_regex_splitter(const std::string& pattern, bool force_icu) {
  if (!force_icu) {
    if (pattern == kGpt2Pattern) return std::make_unique<Gpt2Splitter>();
    if (pattern == kLlama3Pattern) return std::make_unique<Llama3Splitter>(3);
    if (pattern == kQwen2Pattern) return std::make_unique<Llama3Splitter>(1);
  }
  // Ruby syntax, as Oniguruma's default: ^ and $ at every \n, which alone ends a line.
  return std::make_unique<IcuSplitter>(pattern, UREGEX_MULTILINE | UREGEX_UNIX_LINES);
}

std::unique_ptr<Splitter> make_literal_splitter(const std::string& literal) {
  return std::make_unique<IcuSplitter>(literal, UREGEX_LITERAL);
}

}  // namespace refit::text::bpe
