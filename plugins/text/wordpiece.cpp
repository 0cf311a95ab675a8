// WordPiece as Hugging Face `tokenizers` runs it for BERT (normalizers/bert.rs,
// pre_tokenizers/bert.rs, models/wordpiece, utils/truncation.rs). Unicode data from ICU; see
// docs/text.md for why and for the Unicode 8.0 detail below.
#include "wordpiece.h"

#include "text/read_file.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

namespace refit::text {
namespace {

// ---- Unicode properties, as the reference sees them ------------------------------------------
// `tokenizers` classifies control characters (Cc, Cf, Co), punctuation (P*) and non-spacing marks
// (Mn) with the `unicode_categories` crate, whose tables are Unicode 8.0. A character assigned
// later is, for those three questions, unassigned (Cn: none of them). ICU knows when each
// character was assigned (u_charAge); characters whose category changed since 8.0 are listed.

bool assigned_by_unicode_8(UChar32 c) {
  UVersionInfo age;
  u_charAge(c, age);
  return age[0] != 0 && (age[0] < 8 || (age[0] == 8 && age[1] == 0));
}

/// General category in Unicode 8.0 (U_UNASSIGNED for later characters).
int8_t category_v8(UChar32 c) {
  switch (c) {  // recategorised since 8.0 (found by comparing every code point with the reference)
    case 0x166D: return U_OTHER_PUNCTUATION;       // CANADIAN SYLLABICS CHI SIGN, So today
    case 0x111C9: return U_OTHER_PUNCTUATION;      // SHARADA SANDHI MARK, Mn today
    case 0x1734: return U_NON_SPACING_MARK;        // HANUNOO SIGN PAMUDPOD, Mc today
    case 0xA9BD: return U_COMBINING_SPACING_MARK;  // JAVANESE CONSONANT SIGN KERET, Mn today
    case 0x1885:
    case 0x1886: return U_OTHER_LETTER;  // MONGOLIAN LETTER ALI GALI BALUDA, Mn today
    default: break;
  }
  if (c < 0x80) return u_charType(c);  // ASCII: unchanged since 1.1
  if (!assigned_by_unicode_8(c)) return U_UNASSIGNED;
  return u_charType(c);
}

bool is_control(UChar32 c) {  // BertNormalizer: Cc, Cf, Co except \t \n \r (those are whitespace)
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const int8_t t = category_v8(c);
  return t == U_CONTROL_CHAR || t == U_FORMAT_CHAR || t == U_PRIVATE_USE_CHAR;
}

bool is_whitespace(UChar32 c) {  // Rust's char::is_whitespace: the White_Space property
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return true;
  if (c < 0x80) return c == 0x0B || c == 0x0C;
  return u_isUWhiteSpace(c);
}

bool is_punctuation(UChar32 c) {  // ASCII punctuation (incl. $+<=>^`|~) or a P* category
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  switch (category_v8(c)) {
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION: return true;
    default: return false;
  }
}

bool is_nonspacing_mark(UChar32 c) { return c >= 0x300 && category_v8(c) == U_NON_SPACING_MARK; }

bool is_chinese_char(UChar32 c) {  // the ranges of normalizers/bert.rs
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void append_lowercase(std::u32string& out, UChar32 c) {  // Rust's char::to_lowercase
  if (c < 0x80) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
  } else if (c == 0x130) {  // the one full lower-case mapping of more than one character
    out.push_back(U'i');
    out.push_back(0x307);
  } else {
    out.push_back(static_cast<char32_t>(u_tolower(c)));
  }
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

const icu::Normalizer2& nfd() {
  static const icu::Normalizer2* n = [] {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* p = icu::Normalizer2::getNFDInstance(status);
    if (U_FAILURE(status)) throw std::runtime_error(std::string("wordpiece: ICU NFD: ") + u_errorName(status));
    return p;
  }();
  return *n;
}

/// NFD of a code point sequence (canonical decomposition and reordering).
void to_nfd(std::u32string& s) {
  // Nothing below U+00C0 decomposes.
  if (std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0xC0; })) return;
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(s.data()), static_cast<int32_t>(s.size()));
  UErrorCode status = U_ZERO_ERROR;
  icu::UnicodeString d = nfd().normalize(u, status);
  if (U_FAILURE(status)) throw std::runtime_error(std::string("wordpiece: ICU NFD: ") + u_errorName(status));
  s.clear();
  for (int32_t i = 0; i < d.length();) {
    const UChar32 c = d.char32At(i);
    s.push_back(static_cast<char32_t>(c));
    i += U16_LENGTH(c);
  }
}

std::string read_file(const std::string& path) { return read_whole_file(path, "wordpiece"); }

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("wordpiece: " + path + ": " + e.what());
  }
}

/// A special token in tokenizer_config.json: "[UNK]" or {"content": "[UNK]", ...}.
void read_token(const nlohmann::json& cfg, const char* key, std::string& out) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return;
  if (it->is_string()) out = it->get<std::string>();
  else if (it->is_object() && it->contains("content"))
    out = (*it)["content"].get<std::string>();
}

}  // namespace

// ---- construction ----------------------------------------------------------------------------

WordPieceTokenizer WordPieceTokenizer::from_directory(const std::string& dir) {
  const std::string vocab_path = dir + "/vocab.txt";
  const std::string config_path = dir + "/tokenizer_config.json";
  const std::string json_path = dir + "/tokenizer.json";

  std::vector<std::string> vocab;
  {
    std::ifstream in(vocab_path, std::ios::binary);
    if (!in) throw std::runtime_error("wordpiece: cannot open " + vocab_path);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      vocab.push_back(std::move(line));
    }
    if (vocab.empty()) throw std::runtime_error("wordpiece: " + vocab_path + " is empty");
  }

  WordPieceConfig c;
  const nlohmann::json cfg = read_json(config_path);
  try {
    if (cfg.contains("do_basic_tokenize") && !cfg["do_basic_tokenize"].get<bool>())
      throw std::runtime_error("do_basic_tokenize=false is not supported");
    if (cfg.contains("do_lower_case")) c.lowercase = cfg["do_lower_case"].get<bool>();
    if (cfg.contains("strip_accents") && !cfg["strip_accents"].is_null()) c.strip_accents = cfg["strip_accents"].get<bool>();
    if (cfg.contains("tokenize_chinese_chars")) c.handle_chinese_chars = cfg["tokenize_chinese_chars"].get<bool>();
    if (cfg.contains("model_max_length")) {
      const double m = cfg["model_max_length"].get<double>();  // HF writes 1e30 for "no limit"
      c.model_max_length = m > 1e18 ? std::size_t(-1) : static_cast<std::size_t>(m);
    }
    read_token(cfg, "unk_token", c.unk_token);
    read_token(cfg, "cls_token", c.cls_token);
    read_token(cfg, "sep_token", c.sep_token);
    read_token(cfg, "pad_token", c.pad_token);
    read_token(cfg, "mask_token", c.mask_token);
  } catch (const std::exception& e) {
    throw std::runtime_error("wordpiece: " + config_path + ": " + e.what());
  }
  c.special_tokens = {c.pad_token, c.unk_token, c.cls_token, c.sep_token, c.mask_token};

  if (std::ifstream(json_path).good()) {
    const nlohmann::json tj = read_json(json_path);
    try {
      const auto& norm = tj.at("normalizer");
      if (norm.at("type") != "BertNormalizer") throw std::runtime_error("normalizer is not a BertNormalizer");
      c.clean_text = norm.value("clean_text", true);
      const bool lower = norm.value("lowercase", true);
      const bool chinese = norm.value("handle_chinese_chars", true);
      std::optional<bool> strip;
      if (norm.contains("strip_accents") && !norm["strip_accents"].is_null()) strip = norm["strip_accents"].get<bool>();
      if (lower != c.lowercase || chinese != c.handle_chinese_chars || strip != c.strip_accents)
        throw std::runtime_error("normalizer disagrees with tokenizer_config.json (lowercase, "
                                 "handle_chinese_chars or strip_accents)");
      if (tj.at("pre_tokenizer").at("type") != "BertPreTokenizer")
        throw std::runtime_error("pre_tokenizer is not a BertPreTokenizer");
      const auto& model = tj.at("model");
      if (model.at("type") != "WordPiece") throw std::runtime_error("model is not WordPiece");
      c.unk_token = model.value("unk_token", c.unk_token);
      c.continuing_subword_prefix = model.value("continuing_subword_prefix", c.continuing_subword_prefix);
      c.max_input_chars_per_word = model.value("max_input_chars_per_word", c.max_input_chars_per_word);
      c.special_tokens.clear();
      for (const auto& t : tj.value("added_tokens", nlohmann::json::array())) {
        const std::string content = t.at("content").get<std::string>();
        if (t.value("normalized", false) || t.value("lstrip", false) || t.value("rstrip", false) ||
            t.value("single_word", false))
          throw std::runtime_error("added token \"" + content +
                                   "\": only normalized/lstrip/rstrip/single_word = false is supported");
        const auto id = t.at("id").get<std::int64_t>();
        if (id < 0 || id >= static_cast<std::int64_t>(vocab.size()) || vocab[id] != content)
          throw std::runtime_error("added token \"" + content + "\" is not vocab.txt's id " + std::to_string(id));
        c.special_tokens.push_back(content);
      }
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error("wordpiece: " + json_path + ": " + e.what());
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("wordpiece: " + json_path + ": " + e.what());
    }
  }
  return WordPieceTokenizer(std::move(vocab), std::move(c));
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, WordPieceConfig config)
    : vocab_(std::move(vocab)), config_(std::move(config)) {
  ids_.reserve(vocab_.size());
  for (std::size_t i = 0; i < vocab_.size(); ++i) {
    ids_[vocab_[i]] = static_cast<std::int64_t>(i);  // a repeated token keeps its last id (as HF)
    max_token_bytes_ = std::max(max_token_bytes_, vocab_[i].size());
  }
  strip_accents_ = config_.strip_accents.value_or(config_.lowercase);
  unk_id_ = required_id(config_.unk_token, "unk_token");
  cls_id_ = required_id(config_.cls_token, "cls_token");
  sep_id_ = required_id(config_.sep_token, "sep_token");
  pad_id_ = token_to_id(config_.pad_token);
  mask_id_ = token_to_id(config_.mask_token);
  for (const auto& s : config_.special_tokens) {
    if (s.empty()) continue;
    specials_.emplace_back(s, required_id(s, "special token"));
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::int64_t WordPieceTokenizer::required_id(const std::string& token, const char* what) const {
  const std::int64_t id = token_to_id(token);
  if (id < 0) throw std::runtime_error(std::string("wordpiece: ") + what + " \"" + token + "\" is not in the vocabulary");
  return id;
}

std::int64_t WordPieceTokenizer::token_to_id(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  return it == ids_.end() ? -1 : it->second;
}

const std::string& WordPieceTokenizer::id_to_token(std::int64_t id) const {
  if (id < 0 || id >= static_cast<std::int64_t>(vocab_.size()))
    throw std::out_of_range("wordpiece: id " + std::to_string(id) + " is outside the vocabulary");
  return vocab_[static_cast<std::size_t>(id)];
}

// ---- normalisation and pre-tokenisation --------------------------------------------------------

template <class F>
void WordPieceTokenizer::for_each_word(std::string_view text, F&& word) const {
  std::u32string cps;
  std::string w;
  auto segment = [&](std::string_view seg) {
    if (seg.empty()) return;
    // Decode, clean (BertNormalizer: filter, then map whitespace to ' '), space CJK ideographs.
    cps.clear();
    const auto* s = reinterpret_cast<const uint8_t*>(seg.data());
    const int32_t n = static_cast<int32_t>(seg.size());
    for (int32_t i = 0; i < n;) {
      UChar32 c;
      U8_NEXT_OR_FFFD(s, i, n, c);  // malformed UTF-8 becomes U+FFFD (dropped by clean_text)
      if (config_.clean_text) {
        if (c == 0 || c == 0xFFFD || is_control(c)) continue;
        if (is_whitespace(c)) c = ' ';
      }
      if (config_.handle_chinese_chars && is_chinese_char(c)) {
        cps.push_back(U' ');
        cps.push_back(static_cast<char32_t>(c));
        cps.push_back(U' ');
      } else {
        cps.push_back(static_cast<char32_t>(c));
      }
    }
    if (strip_accents_) {
      to_nfd(cps);
      cps.erase(std::remove_if(cps.begin(), cps.end(), [](char32_t c) { return is_nonspacing_mark(c); }), cps.end());
    }
    if (config_.lowercase) {
      std::u32string lower;
      lower.reserve(cps.size());
      for (char32_t c : cps) append_lowercase(lower, static_cast<UChar32>(c));
      cps.swap(lower);
    }
    // BertPreTokenizer: split on whitespace (removed), then isolate punctuation.
    w.clear();
    for (char32_t c : cps) {
      if (is_whitespace(static_cast<UChar32>(c))) {
        if (!w.empty()) word(std::string_view(w), std::int64_t(-1)), w.clear();
      } else if (is_punctuation(static_cast<UChar32>(c))) {
        if (!w.empty()) word(std::string_view(w), std::int64_t(-1)), w.clear();
        append_utf8(w, c);
        word(std::string_view(w), std::int64_t(-1));
        w.clear();
      } else {
        append_utf8(w, c);
      }
    }
    if (!w.empty()) word(std::string_view(w), std::int64_t(-1));
  };

  // Special tokens first, in the raw text: leftmost, then longest.
  std::size_t start = 0;
  if (!specials_.empty()) {
    for (std::size_t pos = 0; pos < text.size();) {
      const std::pair<std::string, std::int64_t>* hit = nullptr;
      for (const auto& sp : specials_) {
        if (text.compare(pos, sp.first.size(), sp.first) == 0) {
          hit = &sp;
          break;
        }
      }
      if (!hit) {
        ++pos;
        continue;
      }
      segment(text.substr(start, pos - start));
      word(std::string_view(hit->first), hit->second);
      pos += hit->first.size();
      start = pos;
    }
  }
  segment(text.substr(start));
}

// ---- WordPiece -------------------------------------------------------------------------------

void WordPieceTokenizer::wordpiece(std::string_view word, std::string& key, std::vector<std::int64_t>& out) const {
  std::size_t chars = 0;
  for (unsigned char b : word) chars += (b & 0xC0) != 0x80;
  if (chars > config_.max_input_chars_per_word) {
    out.push_back(unk_id_);
    return;
  }
  const std::size_t first = out.size();
  const std::string& prefix = config_.continuing_subword_prefix;
  for (std::size_t start = 0; start < word.size();) {
    // Longest first; nothing longer than the longest vocabulary entry can match.
    std::size_t end = std::min(word.size(), start + max_token_bytes_);
    while (end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
    std::int64_t id = -1;
    while (end > start) {
      if (start > 0) key.assign(prefix);
      else
        key.clear();
      key.append(word.data() + start, end - start);
      auto it = ids_.find(key);
      if (it != ids_.end()) {
        id = it->second;
        break;
      }
      --end;  // back to the previous character boundary
      while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
    }
    if (id < 0) {  // a piece that matches nothing: the whole word is unknown
      out.resize(first);
      out.push_back(unk_id_);
      return;
    }
    out.push_back(id);
    start = end;
  }
}

std::vector<std::int64_t> WordPieceTokenizer::tokenize_ids(std::string_view text) const {
  std::vector<std::int64_t> ids;
  std::string key;
  for_each_word(text, [&](std::string_view w, std::int64_t special) {
    if (special >= 0) ids.push_back(special);
    else
      wordpiece(w, key, ids);
  });
  return ids;
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (std::int64_t id : tokenize_ids(text)) out.push_back(vocab_[static_cast<std::size_t>(id)]);
  return out;
}

std::vector<std::string> WordPieceTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for_each_word(text, [&](std::string_view w, std::int64_t) { out.emplace_back(w); });
  return out;
}

// ---- special tokens and truncation -------------------------------------------------------------

Encoding WordPieceTokenizer::encode(std::string_view text, std::optional<std::size_t> max_length) const {
  std::vector<std::int64_t> a = tokenize_ids(text);
  if (max_length) {
    if (*max_length < 2)
      throw std::invalid_argument("wordpiece: max_length " + std::to_string(*max_length) +
                                  " leaves no room for [CLS] and [SEP]");
    if (a.size() > *max_length - 2) a.resize(*max_length - 2);
  }
  Encoding e;
  e.input_ids.reserve(a.size() + 2);
  e.input_ids.push_back(cls_id_);
  e.input_ids.insert(e.input_ids.end(), a.begin(), a.end());
  e.input_ids.push_back(sep_id_);
  e.token_type_ids.assign(e.input_ids.size(), 0);
  e.attention_mask.assign(e.input_ids.size(), 1);
  return e;
}

Encoding WordPieceTokenizer::encode_pair(std::string_view a_text, std::string_view b_text,
                                         std::optional<std::size_t> max_length) const {
  std::vector<std::int64_t> a = tokenize_ids(a_text);
  std::vector<std::int64_t> b = tokenize_ids(b_text);
  if (max_length) {
    if (*max_length < 3)
      throw std::invalid_argument("wordpiece: max_length " + std::to_string(*max_length) +
                                  " leaves no room for [CLS] and two [SEP]");
    // tokenizers' truncate_encodings, LongestFirst, for a pair.
    const std::size_t max = *max_length - 3;
    if (a.size() + b.size() > max) {
      std::size_t n1 = a.size(), n2 = b.size();
      const bool swap = n1 > n2;
      if (swap) std::swap(n1, n2);
      n2 = n1 > max ? n1 : std::max(n1, max - n1);
      if (n1 + n2 > max) {
        n1 = max / 2;
        n2 = n1 + max % 2;
      }
      if (swap) std::swap(n1, n2);
      if (a.size() > n1) a.resize(n1);
      if (b.size() > n2) b.resize(n2);
    }
  }
  Encoding e;
  e.input_ids.reserve(a.size() + b.size() + 3);
  e.input_ids.push_back(cls_id_);
  e.input_ids.insert(e.input_ids.end(), a.begin(), a.end());
  e.input_ids.push_back(sep_id_);
  e.token_type_ids.assign(e.input_ids.size(), 0);
  e.input_ids.insert(e.input_ids.end(), b.begin(), b.end());
  e.input_ids.push_back(sep_id_);
  e.token_type_ids.resize(e.input_ids.size(), 1);
  e.attention_mask.assign(e.input_ids.size(), 1);
  return e;
}

}  // namespace refit::text
