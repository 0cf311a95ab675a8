// Byte-level BPE as Hugging Face `tokenizers` runs it (tokenizer/added_vocabulary.rs,
// normalizer.rs, pre_tokenizers/{byte_level,split,digits}.rs, models/bpe/{model,word}.rs,
// processors/template.rs, decoders: byte_level.rs). See byte_bpe.h and docs/text.md.
#include "byte_bpe.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "byte_bpe_impl.h"
#include "refit/error.h"

namespace refit::text {

using bpe::CharClass;
using bpe::Match;
using Json = nlohmann::json;

// ---- UTF-8 repair --------------------------------------------------------------------------------

namespace {

// Length of the valid UTF-8 prefix of a sequence starting at lead byte b0 that continues with
// `next`; Unicode's Table 3-7 (well-formed byte sequences).
bool valid_second(unsigned char b0, unsigned char b1) {
  switch (b0) {
    case 0xE0: return b1 >= 0xA0 && b1 <= 0xBF;
    case 0xED: return b1 >= 0x80 && b1 <= 0x9F;
    case 0xF0: return b1 >= 0x90 && b1 <= 0xBF;
    case 0xF4: return b1 >= 0x80 && b1 <= 0x8F;
    default: return b1 >= 0x80 && b1 <= 0xBF;
  }
}

int sequence_length(unsigned char b0) {  // 0: not a lead byte
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return 2;
  if (b0 >= 0xE0 && b0 <= 0xEF) return 3;
  if (b0 >= 0xF0 && b0 <= 0xF4) return 4;
  return 0;
}

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const int len = sequence_length(p[i]);
    if (len == 0 || i + len > n || !valid_second(p[i], p[i + 1])) return false;
    for (int k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

}  // namespace

std::string Utf8StreamRepair::feed(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + 4);
  for (unsigned char b : bytes) {
    if (npending_ == 0) {
      const int len = sequence_length(b);
      if (len == 1) out += static_cast<char>(b);
      else if (len == 0)
        out += kReplacement;
      else
        pending_[npending_++] = b;
      continue;
    }
    const int len = sequence_length(pending_[0]);
    const bool fits = npending_ == 1 ? valid_second(pending_[0], b) : (b & 0xC0) == 0x80;
    if (fits) {
      pending_[npending_++] = b;
      if (npending_ == len) {
        out.append(reinterpret_cast<const char*>(pending_), static_cast<std::size_t>(len));
        npending_ = 0;
      }
      continue;
    }
    // The sequence so far is a maximal invalid subpart: one U+FFFD, and `b` starts afresh.
    out += kReplacement;
    npending_ = 0;
    const int l2 = sequence_length(b);
    if (l2 == 1) out += static_cast<char>(b);
    else if (l2 == 0)
      out += kReplacement;
    else
      pending_[npending_++] = b;
  }
  return out;
}

std::string Utf8StreamRepair::finish() {
  const bool cut = npending_ > 0;
  npending_ = 0;
  return cut ? std::string(kReplacement) : std::string();
}

std::string repair_utf8(std::string_view bytes) {
  Utf8StreamRepair r;
  std::string out = r.feed(bytes);
  out += r.finish();
  return out;
}

// ---- the byte map --------------------------------------------------------------------------------

namespace bpe {

const ByteMap& byte_map() {
  static const ByteMap m = [] {
    ByteMap t{};
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others (controls,
    // space, DEL, NBSP, soft hyphen) for U+0100 onwards, in byte order.
    std::vector<bool> printable(256, false);
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      t.to_char[b] = c;
      t.from_char[c] = static_cast<std::int16_t>(b);
    }
    return t;
  }();
  return m;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::optional<std::string> token_to_raw(std::string_view token) {
  const ByteMap& m = byte_map();
  std::string raw;
  raw.reserve(token.size());
  for (std::size_t i = 0; i < token.size();) {
    const char32_t c = next_code_point(token, i);
    if (c >= 512 || m.from_char[c] < 0) return std::nullopt;
    raw += static_cast<char>(m.from_char[c]);
  }
  return raw;
}

std::string raw_to_token(std::string_view raw) {
  const ByteMap& m = byte_map();
  std::string t;
  t.reserve(raw.size() * 2);
  for (unsigned char b : raw) append_utf8(t, m.to_char[b]);
  return t;
}

}  // namespace bpe

// ---- construction from parts -------------------------------------------------------------------

namespace {

std::atomic<std::uint64_t> next_cache_id{1};

bool is_unicode_whitespace(char32_t c) { return bpe::char_class(c) == CharClass::space; }

// Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, join controls.
bool is_word_char(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) return true;
  switch (u_charType(cp)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION: return true;
    default: return false;
  }
}

char32_t last_code_point(std::string_view s) {  // s valid UTF-8, non-empty
  std::size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return bpe::next_code_point(s, i);
}

}  // namespace

void bpe::Impl::finish(const std::string& where) {
  const ByteMap& m = byte_map();
  // Model ids -> tokens; tokens in the byte alphabet also by their raw bytes.
  std::int64_t max_id = -1;
  for (const auto& [tok, id] : vocab) max_id = std::max(max_id, id);
  for (const auto& a : added) max_id = std::max(max_id, a.id);
  id_count = static_cast<std::size_t>(max_id + 1);
  id_token.assign(id_count, std::string());
  id_known.assign(id_count, 0);
  for (const auto& [tok, id] : vocab) {
    id_token[static_cast<std::size_t>(id)] = tok;
    id_known[static_cast<std::size_t>(id)] = 1;
    if (auto raw = token_to_raw(tok)) raw_vocab.emplace(std::move(*raw), static_cast<std::int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_utf8(c, m.to_char[b]);
    auto it = vocab.find(c);
    byte_id[b] = it == vocab.end() ? -1 : static_cast<std::int32_t>(it->second);
  }
  // Added tokens: their ids decode to their content; special ones are skipped on request.
  std::unordered_set<std::string> special_contents;
  for (const auto& a : added) {
    id_token[static_cast<std::size_t>(a.id)] = a.content;
    id_known[static_cast<std::size_t>(a.id)] = 1;
    added_ids[a.content] = a.id;
    if (a.special) special_contents.insert(a.content);
  }
  id_special.assign(id_count, 0);
  id_bytes.assign(id_count, std::string());
  for (std::size_t id = 0; id < id_count; ++id) {
    if (!id_known[id]) continue;
    const std::string& tok = id_token[id];
    // tokenizers checks the token *string* against the special set (added_vocabulary.rs).
    id_special[id] = special_contents.count(tok) ? 1 : 0;
    if (decoder == Decoder::byte_level) {
      auto raw = token_to_raw(tok);
      id_bytes[id] = raw ? *raw : tok;  // a token outside the byte alphabet decodes to its own UTF-8
    } else {
      id_bytes[id] = tok;
    }
  }
  // The two added-token matchers (non-normalized tokens on the raw text, normalized ones after the
  // normaliser), each longest first within a first byte.
  for (std::size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    if (a.pattern.empty()) continue;  // would match everywhere; tokenizers never adds one
    AddedMatcher& mt = a.normalized ? normalized_matcher : raw_matcher;
    const auto b = static_cast<unsigned char>(a.pattern[0]);
    mt.by_first_byte[b].push_back(static_cast<std::uint32_t>(i));
    mt.any = true;
  }
  for (AddedMatcher* mt : {&raw_matcher, &normalized_matcher})
    for (auto& v : mt->by_first_byte)
      std::stable_sort(v.begin(), v.end(),
                       [&](std::uint32_t x, std::uint32_t y) { return added[x].pattern.size() > added[y].pattern.size(); });
  // Merges, keyed by the pair of ids.
  merges.build(merge_list);
  merge_list.clear();
  merge_list.shrink_to_fit();
  cache_id = next_cache_id.fetch_add(1);
  (void)where;
}

std::int64_t bpe::Impl::add_token(AddedToken a) {
  // As AddedVocabulary::add_tokens: an existing content keeps its id (an earlier added token's or
  // the model's), a new one takes the next id after the model's vocabulary.
  if (a.content.empty()) return -1;
  if (a.pattern.empty()) a.pattern = a.content;
  auto prev = std::find_if(added.begin(), added.end(), [&](const AddedToken& t) { return t.content == a.content; });
  if (prev != added.end()) {
    a.id = prev->id;
    const bool was_special = prev->special;
    *prev = std::move(a);
    prev->special = prev->special || was_special;  // the special set only grows
    return prev->id;
  }
  auto it = vocab.find(a.content);
  if (it != vocab.end()) {
    a.id = it->second;
  } else {
    a.id = next_added_id++;
  }
  added.push_back(std::move(a));
  return added.back().id;
}

// ---- encoding ------------------------------------------------------------------------------------

namespace {

// Per-thread word caches, a few tokenizers' worth (a data loader uses one; tests build many):
// pre-token bytes -> ids. Nothing in them depends on the thread, so results never differ.
struct WordCache {
  std::uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<std::uint32_t, std::uint32_t>> words;  // -> (offset, count)
  std::vector<std::int32_t> ids;
};
constexpr std::size_t kCacheSlots = 4;
constexpr std::size_t kCacheMaxWords = 200000;
constexpr std::size_t kCacheMaxWordBytes = 256;  // as tokenizers' MAX_LENGTH

WordCache& cache_for(std::uint64_t owner) {
  thread_local WordCache slots[kCacheSlots];
  thread_local std::size_t next = 0;
  for (auto& s : slots)
    if (s.owner == owner) return s;
  WordCache& s = slots[next];
  next = (next + 1) % kCacheSlots;
  s.owner = owner;
  s.words.clear();
  s.ids.clear();
  return s;
}

struct Symbol {
  std::int32_t id;
  std::int32_t prev, next;
  bool gone;
};

struct Candidate {
  std::uint32_t rank, pos;
  std::int32_t new_id;
  bool operator<(const Candidate& o) const {  // a max-heap of the lowest rank, then leftmost
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

void bpe::MergeTable::build(const std::vector<MergeEntry>& list) {
  std::size_t cap = 16;
  while (cap < list.size() * 2 + 16) cap <<= 1;
  slots.assign(cap, Slot{});
  mask = cap - 1;
  for (const MergeEntry& e : list) {
    const std::uint64_t key =
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(e.a)) << 32) | static_cast<std::uint32_t>(e.b);
    std::size_t i = hash(key) & mask;
    while (slots[i].used && slots[i].key != key) i = (i + 1) & mask;
    // A pair listed twice keeps its later rank (tokenizers collects the list into a map).
    slots[i] = Slot{key, e.rank, e.new_id, true};
  }
}

void bpe::Impl::merge_word(std::string_view raw, std::vector<std::int32_t>& out) const {
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  sym.clear();
  heap.clear();
  // One symbol per byte; a byte without a token becomes the unknown token (fused when fuse_unk)
  // or, with no unknown token, is dropped - as merge_word does.
  bool pending_unk = false;
  for (unsigned char b : raw) {
    const std::int32_t id = byte_id[b];
    if (id >= 0) {
      if (pending_unk) sym.push_back({static_cast<std::int32_t>(*unk_id), 0, 0, false}), pending_unk = false;
      sym.push_back({id, 0, 0, false});
    } else if (unk_token) {
      if (!unk_id) throw refit::Error("byte_bpe: " + label + ": unk_token \"" + *unk_token + "\" is not in the vocabulary");
      if (pending_unk && !fuse_unk) sym.push_back({static_cast<std::int32_t>(*unk_id), 0, 0, false});
      pending_unk = true;
    }
  }
  if (pending_unk) sym.push_back({static_cast<std::int32_t>(*unk_id), 0, 0, false});
  const auto n = static_cast<std::int32_t>(sym.size());
  for (std::int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  for (std::int32_t i = 0; i + 1 < n; ++i)
    if (const auto* m = merges.find(sym[i].id, sym[i + 1].id))
      heap.push_back({m->rank, static_cast<std::uint32_t>(i), m->new_id});
  std::make_heap(heap.begin(), heap.end());
  // Word::merge_all: the lowest-ranked pair first, the leftmost among equals; stale entries skipped.
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = sym[top.pos];
    if (left.gone || left.next < 0) continue;
    Symbol& right = sym[left.next];
    const auto* m = merges.find(left.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    left.id = top.new_id;
    right.gone = true;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = static_cast<std::int32_t>(top.pos);
    if (left.prev >= 0) {
      if (const auto* pm = merges.find(sym[left.prev].id, left.id)) {
        heap.push_back({pm->rank, static_cast<std::uint32_t>(left.prev), pm->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (left.next >= 0) {
      if (const auto* nm = merges.find(left.id, sym[left.next].id)) {
        heap.push_back({nm->rank, top.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (const Symbol& s : sym)
    if (!s.gone) out.push_back(s.id);
}

void bpe::Impl::bpe_piece(std::string_view raw, std::vector<std::int64_t>& out) const {
  if (raw.empty()) return;
  if (ignore_merges) {
    auto it = raw_vocab.find(std::string(raw));
    if (it != raw_vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  WordCache& cache = cache_for(cache_id);
  if (raw.size() < kCacheMaxWordBytes) {
    thread_local std::string key;
    key.assign(raw.data(), raw.size());
    auto it = cache.words.find(key);
    if (it != cache.words.end()) {
      const std::int32_t* p = cache.ids.data() + it->second.first;
      out.insert(out.end(), p, p + it->second.second);
      return;
    }
  }
  thread_local std::vector<std::int32_t> ids;
  ids.clear();
  merge_word(raw, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (raw.size() < kCacheMaxWordBytes) {
    if (cache.words.size() >= kCacheMaxWords) cache.words.clear(), cache.ids.clear();
    cache.words.emplace(std::string(raw), std::make_pair(static_cast<std::uint32_t>(cache.ids.size()),
                                                         static_cast<std::uint32_t>(ids.size())));
    cache.ids.insert(cache.ids.end(), ids.begin(), ids.end());
  }
}

namespace {

// NormalizedString::split: the pieces a list of (offsets, is_match) leaves under a behaviour.
struct Piece {
  std::uint32_t start, end;
  bool match;
};

void apply_behavior(bpe::SplitBehavior behavior, std::vector<Piece>& m) {
  using B = bpe::SplitBehavior;
  std::vector<Piece> out;
  switch (behavior) {
    case B::isolated:
      for (auto& p : m) p.match = false;
      return;
    case B::removed: return;  // matches are dropped by the caller
    case B::contiguous: {
      bool previous = false;
      for (const Piece& p : m) {
        if (p.match == previous && !out.empty()) out.back().end = p.end;
        else
          out.push_back({p.start, p.end, false});
        previous = p.match;
      }
      break;
    }
    case B::merged_with_previous: {
      bool previous = false;
      for (const Piece& p : m) {
        if (p.match && !previous && !out.empty()) out.back().end = p.end;
        else
          out.push_back({p.start, p.end, false});
        previous = p.match;
      }
      break;
    }
    case B::merged_with_next: {
      bool previous = false;
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->match && !previous && !out.empty()) out.back().start = it->start;
        else
          out.push_back({it->start, it->end, false});
        previous = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  m.swap(out);
}

// Pattern::find_matches: matches and the gaps between them, in order.
void regex_pieces(const bpe::Splitter& sp, std::string_view s, std::vector<Piece>& out) {
  thread_local std::vector<Match> found;
  found.clear();
  sp.find(s, found);
  std::uint32_t prev = 0;
  for (const Match& m : found) {
    if (prev != m.start) out.push_back({prev, m.start, false});
    out.push_back({m.start, m.end, true});
    prev = m.end;
  }
  if (prev != s.size()) out.push_back({prev, static_cast<std::uint32_t>(s.size()), false});
}

void digit_pieces(std::string_view s, std::vector<Piece>& out) {  // char::is_numeric (N*)
  std::uint32_t last = 0;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t b = i;
    const char32_t c = bpe::next_code_point(s, i);
    if (bpe::char_class(c) == CharClass::number) {
      if (last < b) out.push_back({last, static_cast<std::uint32_t>(b), false});
      out.push_back({static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(i), true});
      last = static_cast<std::uint32_t>(i);
    }
  }
  if (s.size() > last) out.push_back({last, static_cast<std::uint32_t>(s.size()), false});
}

}  // namespace

template <class Emit>
void bpe::Impl::run_steps(std::size_t step, std::string_view piece, Emit& emit) const {
  if (piece.empty()) return;
  if (step == steps.size()) {
    // ByteLevel: the prefix space, then GPT-2's regex when use_regex.
    std::string prefixed;
    if (add_prefix_space && piece[0] != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed += ' ';
      prefixed.append(piece.data(), piece.size());
      piece = prefixed;
    }
    if (!gpt2) {
      emit(piece);
      return;
    }
    thread_local std::vector<Match> found;
    const std::size_t base = found.size();
    gpt2->find(piece, found);  // covers the piece: every character starts a match
    for (std::size_t k = base; k < found.size(); ++k) emit(piece.substr(found[k].start, found[k].end - found[k].start));
    found.resize(base);
    return;
  }
  const PreStep& st = steps[step];
  std::vector<Piece> pieces;
  if (st.kind == PreStep::Kind::digits) digit_pieces(piece, pieces);
  else
    regex_pieces(*st.splitter, piece, pieces);
  if (st.invert)
    for (auto& p : pieces) p.match = !p.match;
  const SplitBehavior behavior = st.kind == PreStep::Kind::digits
                                     ? (st.individual_digits ? SplitBehavior::isolated : SplitBehavior::contiguous)
                                     : st.behavior;
  apply_behavior(behavior, pieces);
  for (const Piece& p : pieces) {
    if (p.match) continue;  // removed
    run_steps(step + 1, piece.substr(p.start, p.end - p.start), emit);
  }
}

template <class Emit>
void bpe::Impl::split_added(const AddedMatcher& mt, std::string_view s, Emit& emit) const {
  // AddedVocabulary::find_matches: leftmost-longest matches, then single_word / lstrip / rstrip.
  if (!mt.any) {
    emit(s, -1);
    return;
  }
  std::size_t start_offset = 0;
  for (std::size_t pos = 0; pos < s.size();) {
    const auto& bucket = mt.by_first_byte[static_cast<unsigned char>(s[pos])];
    const AddedToken* hit = nullptr;
    for (std::uint32_t idx : bucket) {
      const AddedToken& a = added[idx];
      if (s.compare(pos, a.pattern.size(), a.pattern) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    std::size_t start = pos, stop = pos + hit->pattern.size();
    pos = stop;  // the match iterator resumes after a match even if it is discarded below
    if (hit->single_word) {
      const bool start_space = start == 0 || !is_word_char(last_code_point(s.substr(0, start)));
      std::size_t k = stop;
      const bool stop_space = stop == s.size() || !is_word_char(bpe::next_code_point(s, k));
      if (!start_space || !stop_space) continue;
    }
    if (hit->lstrip) {
      std::size_t b = start;
      while (b > 0) {
        std::size_t q = b - 1;
        while (q > 0 && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
        std::size_t q2 = q;
        if (!is_unicode_whitespace(bpe::next_code_point(s, q2))) break;
        b = q;
      }
      start = std::max(b, start_offset);
    }
    if (hit->rstrip) {
      while (stop < s.size()) {
        std::size_t q = stop;
        if (!is_unicode_whitespace(bpe::next_code_point(s, q))) break;
        stop = q;
      }
    }
    if (start_offset < start) emit(s.substr(start_offset, start - start_offset), -1);
    emit(std::string_view(), hit->id);
    start_offset = stop;  // the search resumes at the match's end, not after what rstrip took
  }
  if (start_offset < s.size()) emit(s.substr(start_offset), -1);
}

std::string bpe::Impl::normalize(std::string_view s) const {
  static const icu::Normalizer2* nfc_instance = [] {
    UErrorCode st = U_ZERO_ERROR;
    const icu::Normalizer2* p = icu::Normalizer2::getNFCInstance(st);
    if (U_FAILURE(st)) throw refit::Error(std::string("byte_bpe: ICU NFC: ") + u_errorName(st));
    return p;
  }();
  // Text below U+0300 is in NFC already (no composition starts there).
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; })) return std::string(s);
  UErrorCode st = U_ZERO_ERROR;
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  const icu::UnicodeString n = nfc_instance->normalize(u, st);
  if (U_FAILURE(st)) throw refit::Error(std::string("byte_bpe: ICU NFC: ") + u_errorName(st));
  std::string out;
  n.toUTF8String(out);
  return out;
}

template <class Emit>
void bpe::Impl::for_each_piece(std::string_view text, Emit&& emit) const {
  // extract_and_normalize: non-normalized added tokens in the raw text; normalise what is between
  // them; normalized added tokens in that; pre-tokenise the rest.
  auto pre = [&](std::string_view seg, std::int64_t id) {
    if (id >= 0) emit(std::string_view(), id);
    else if (!seg.empty()) {
      auto piece = [&](std::string_view p) { emit(p, std::int64_t(-1)); };
      run_steps(0, seg, piece);
    }
  };
  auto second = [&](std::string_view seg, std::int64_t id) {
    if (id >= 0) {
      emit(std::string_view(), id);
      return;
    }
    if (seg.empty()) return;
    if (nfc) {
      const std::string n = normalize(seg);
      split_added(normalized_matcher, n, pre);
    } else {
      split_added(normalized_matcher, seg, pre);
    }
  };
  split_added(raw_matcher, text, second);
}

std::vector<std::int64_t> ByteBpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const bpe::Impl& m = *impl_;
  std::string repaired;
  if (!valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  std::vector<std::int64_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), m.prefix_ids.begin(), m.prefix_ids.end());
  m.for_each_piece(text, [&](std::string_view piece, std::int64_t id) {
    if (id >= 0) out.push_back(id);
    else
      m.bpe_piece(piece, out);
  });
  if (add_special_tokens) out.insert(out.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return out;
}

std::vector<std::string> ByteBpeTokenizer::pre_tokenize(std::string_view text) const {
  std::string repaired;
  if (!valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  std::vector<std::string> out;
  impl_->for_each_piece(text, [&](std::string_view piece, std::int64_t id) {
    out.push_back(id >= 0 ? impl_->id_token[static_cast<std::size_t>(id)] : std::string(piece));
  });
  return out;
}

// ---- decoding ------------------------------------------------------------------------------------

std::string ByteBpeTokenizer::decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens) const {
  const bpe::Impl& m = *impl_;
  std::string bytes;
  bool first = true;
  for (std::int64_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= m.id_count || !m.id_known[id]) continue;
    if (skip_special_tokens && m.id_special[id]) continue;
    if (m.decoder == bpe::Decoder::none && !first) bytes += ' ';  // no decoder: tokens joined by spaces
    bytes += m.id_bytes[id];
    first = false;
  }
  return m.decoder == bpe::Decoder::byte_level ? repair_utf8(bytes) : bytes;
}

std::string ByteBpeTokenizer::StreamDecoder::push(std::int64_t id) {
  const bpe::Impl& m = *tok_->impl_;
  if (id < 0 || static_cast<std::size_t>(id) >= m.id_count || !m.id_known[id]) return {};
  if (skip_special_ && m.id_special[id]) return {};
  // As decode(): without a decoder the tokens are joined by spaces and the bytes kept as they are.
  if (m.decoder == bpe::Decoder::none) {
    std::string out = first_ ? m.id_bytes[id] : " " + m.id_bytes[id];
    first_ = false;
    return out;
  }
  return repair_.feed(m.id_bytes[id]);
}

// ---- lookups -------------------------------------------------------------------------------------

std::optional<std::int64_t> ByteBpeTokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  auto a = impl_->added_ids.find(key);
  if (a != impl_->added_ids.end()) return a->second;
  auto v = impl_->vocab.find(key);
  if (v != impl_->vocab.end()) return v->second;
  return std::nullopt;
}

std::optional<std::string> ByteBpeTokenizer::id_to_token(std::int64_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_count || !impl_->id_known[id]) return std::nullopt;
  return impl_->id_token[static_cast<std::size_t>(id)];
}

std::size_t ByteBpeTokenizer::vocab_size() const {
  // get_vocab_size(with_added_tokens=true): the model's entries and the added tokens it lacks.
  std::size_t n = impl_->vocab.size();
  for (const auto& a : impl_->added)
    if (!impl_->vocab.count(a.content)) ++n;
  return n;
}

std::optional<std::int64_t> ByteBpeTokenizer::bos_id() const { return impl_->bos; }
std::optional<std::int64_t> ByteBpeTokenizer::eos_id() const { return impl_->eos; }
std::optional<std::int64_t> ByteBpeTokenizer::pad_id() const { return impl_->pad; }

bool ByteBpeTokenizer::is_special(std::int64_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->id_count && impl_->id_special[id];
}

std::optional<std::string> ByteBpeTokenizer::token_bytes(std::int64_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_count || !impl_->id_known[id]) return std::nullopt;
  return impl_->id_bytes[static_cast<std::size_t>(id)];
}

}  // namespace refit::text
