// ByteBpeTokenizer from a tokenizer.json or from a GGUF-style vocabulary (byte_bpe.h). Every value
// is checked; an error names the file and the JSON pointer (or the GGUF key) of what is wrong.
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "byte_bpe.h"
#include "byte_bpe_impl.h"
#include "refit/config.h"
#include "refit/error.h"
#include "text/read_file.h"

namespace refit::text {

using Json = nlohmann::json;
using bpe::AddedToken;
using bpe::Impl;
using bpe::PreStep;
using bpe::SplitBehavior;

namespace {

// Both fall through to the regex engine (ICU) and are transformers' table entries
// (integrations/gguf/gguf_tokenizer_mapping.py).
const char* const kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt4oPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// RFC 6901 escaping, as recipes' pointers are written (refit/config.h).
std::string pointer(const std::string& base, const std::string& key) { return refit::json_pointer_append(base, key); }
std::string pointer(const std::string& base, std::size_t index) { return base + "/" + std::to_string(index); }

const char* type_name(const Json& j) { return j.type_name(); }

class Reader {
 public:
  explicit Reader(std::string label) : label_(std::move(label)) {}

  [[noreturn]] void fail(const std::string& ptr, const std::string& msg) const {
    throw refit::Error("byte_bpe: " + label_ + ": " + (ptr.empty() ? "/" : ptr) + ": " + msg);
  }
  const Json& object(const Json& j, const std::string& ptr) const {
    if (!j.is_object()) fail(ptr, std::string("expected an object, got ") + type_name(j));
    return j;
  }
  const Json& array(const Json& j, const std::string& ptr) const {
    if (!j.is_array()) fail(ptr, std::string("expected an array, got ") + type_name(j));
    return j;
  }
  const Json& required(const Json& obj, const char* key, const std::string& ptr) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(pointer(ptr, key), "missing");
    return *it;
  }
  std::string string(const Json& j, const std::string& ptr) const {
    if (!j.is_string()) fail(ptr, std::string("expected a string, got ") + type_name(j));
    return j.get<std::string>();
  }
  std::string string_at(const Json& obj, const char* key, const std::string& ptr) const {
    return string(required(obj, key, ptr), pointer(ptr, key));
  }
  bool boolean(const Json& obj, const char* key, const std::string& ptr, bool dflt) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(pointer(ptr, key), std::string("expected true or false, got ") + type_name(*it));
    return it->get<bool>();
  }
  std::int64_t id(const Json& j, const std::string& ptr) const {
    if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<std::int64_t>() >= 0))
      fail(ptr, std::string("expected an id (an integer >= 0), got ") + (j.is_number() ? j.dump() : type_name(j)));
    const auto v = j.get<std::uint64_t>();
    if (v > 0x7FFFFFFFu) fail(ptr, "id " + std::to_string(v) + " is beyond 2^31 - 1");
    return static_cast<std::int64_t>(v);
  }
  /// `type` of a component object.
  std::string type(const Json& j, const std::string& ptr) const { return string_at(object(j, ptr), "type", ptr); }

  const std::string& label() const { return label_; }

 private:
  std::string label_;
};

SplitBehavior behavior_of(const Reader& r, const std::string& s, const std::string& ptr) {
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  r.fail(ptr, "unknown split behavior \"" + s + "\" (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous)");
}

struct PreTokenizerSpec {
  std::vector<PreStep> steps;
  bool byte_level = false, add_prefix_space = false, use_regex = true;
};

// Sequences inside sequences: bounded, so that a hostile file cannot recurse the stack away.
constexpr int kMaxNesting = 16;

void read_pre_tokenizer(const Reader& r, const Json& j, const std::string& ptr, PreTokenizerSpec& spec, int depth = 0) {
  if (depth > kMaxNesting) r.fail(ptr, "sequences nested deeper than " + std::to_string(kMaxNesting));
  const std::string type = r.type(j, ptr);
  if (spec.byte_level)
    r.fail(ptr, "a " + type + " step after ByteLevel: refit needs ByteLevel to be the last pre-tokenizer");
  if (type == "Sequence") {
    const Json& list = r.array(r.required(j, "pretokenizers", ptr), pointer(ptr, "pretokenizers"));
    for (std::size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(r, list[i], pointer(pointer(ptr, "pretokenizers"), i), spec, depth + 1);
  } else if (type == "ByteLevel") {
    spec.byte_level = true;
    spec.add_prefix_space = r.boolean(j, "add_prefix_space", ptr, true);
    spec.use_regex = r.boolean(j, "use_regex", ptr, true);
  } else if (type == "Split") {
    PreStep st;
    st.kind = PreStep::Kind::split;
    const std::string pp = pointer(ptr, "pattern");
    const Json& pat = r.object(r.required(j, "pattern", ptr), pp);
    try {
      if (pat.contains("Regex")) st.splitter = bpe::make_regex_splitter(r.string_at(pat, "Regex", pp));
      else if (pat.contains("String"))
        st.splitter = bpe::make_literal_splitter(r.string_at(pat, "String", pp));
      else
        r.fail(pp, "expected {\"Regex\": ...} or {\"String\": ...}");
    } catch (const std::invalid_argument& e) {
      r.fail(pointer(pp, pat.contains("Regex") ? "Regex" : "String"), e.what());
    }
    st.behavior = behavior_of(r, r.string_at(j, "behavior", ptr), pointer(ptr, "behavior"));
    st.invert = r.boolean(j, "invert", ptr, false);
    spec.steps.push_back(std::move(st));
  } else if (type == "Digits") {
    PreStep st;
    st.kind = PreStep::Kind::digits;
    st.individual_digits = r.boolean(j, "individual_digits", ptr, false);
    spec.steps.push_back(std::move(st));
  } else {
    r.fail(pointer(ptr, "type"),
           "pre-tokenizer \"" + type +
               "\" is not supported for byte-level BPE (supported: ByteLevel, Split, Digits, Sequence)");
  }
}

void read_normalizer(const Reader& r, const Json& j, const std::string& ptr, bool& nfc, int depth = 0) {
  if (j.is_null()) return;
  if (depth > kMaxNesting) r.fail(ptr, "sequences nested deeper than " + std::to_string(kMaxNesting));
  const std::string type = r.type(j, ptr);
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence") {
    const Json& list = r.array(r.required(j, "normalizers", ptr), pointer(ptr, "normalizers"));
    for (std::size_t i = 0; i < list.size(); ++i)
      read_normalizer(r, list[i], pointer(pointer(ptr, "normalizers"), i), nfc, depth + 1);
  } else {
    r.fail(pointer(ptr, "type"), "normalizer \"" + type + "\" is not supported (supported: none, NFC)");
  }
}

void read_template(const Reader& r, const Json& j, const std::string& ptr, Impl& m) {
  const std::string sp = pointer(ptr, "special_tokens");
  const Json& specials = j.contains("special_tokens") ? r.object(j["special_tokens"], sp) : Json::object();
  const std::string single_ptr = pointer(ptr, "single");
  const Json& single = r.array(r.required(j, "single", ptr), single_ptr);
  bool seen_a = false;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string ip = pointer(single_ptr, i);
    const Json& item = r.object(single[i], ip);
    if (item.contains("Sequence")) {
      const std::string which =
          r.string_at(r.object(item["Sequence"], pointer(ip, "Sequence")), "id", pointer(ip, "Sequence"));
      if (which != "A" || seen_a) r.fail(ip, "the single template must hold the sequence $A once");
      seen_a = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name =
          r.string_at(r.object(item["SpecialToken"], pointer(ip, "SpecialToken")), "id", pointer(ip, "SpecialToken"));
      auto it = specials.find(name);
      if (it == specials.end()) r.fail(ip, "special token \"" + name + "\" is not in " + sp);
      const std::string tp = pointer(sp, name);
      const Json& ids = r.array(r.required(r.object(*it, tp), "ids", tp), pointer(tp, "ids"));
      for (std::size_t k = 0; k < ids.size(); ++k)
        (seen_a ? m.suffix_ids : m.prefix_ids).push_back(r.id(ids[k], pointer(pointer(tp, "ids"), k)));
    } else {
      r.fail(ip, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_a) r.fail(single_ptr, "the single template has no $A");
}

void read_post_processor(const Reader& r, const Json& j, const std::string& ptr, Impl& m, bool& have_template,
                         int depth = 0) {
  if (j.is_null()) return;
  if (depth > kMaxNesting) r.fail(ptr, "sequences nested deeper than " + std::to_string(kMaxNesting));
  const std::string type = r.type(j, ptr);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "TemplateProcessing") {
    if (have_template) r.fail(ptr, "a second TemplateProcessing");
    have_template = true;
    read_template(r, j, ptr, m);
  } else if (type == "Sequence") {
    const Json& list = r.array(r.required(j, "processors", ptr), pointer(ptr, "processors"));
    for (std::size_t i = 0; i < list.size(); ++i)
      read_post_processor(r, list[i], pointer(pointer(ptr, "processors"), i), m, have_template, depth + 1);
  } else {
    r.fail(pointer(ptr, "type"),
           "post-processor \"" + type + "\" is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
  }
}

// The id table is as large as the largest id: ids must be dense-ish (real files are 0..n-1), so a
// file claiming id 2^31 cannot make refit allocate gigabytes.
void check_dense(const Reader& r, const Impl& m, const std::string& ptr) {
  std::int64_t max_id = -1;
  for (const auto& [t, id] : m.vocab) max_id = std::max(max_id, id);
  const auto limit = static_cast<std::int64_t>(2 * m.vocab.size() + 1024);
  if (max_id >= limit)
    r.fail(ptr, "id " + std::to_string(max_id) + " with only " + std::to_string(m.vocab.size()) +
                    " tokens: the ids are not (nearly) 0..n-1");
}

void add_merge(const Reader& r, Impl& m, const std::string& a, const std::string& b, std::uint32_t rank,
               const std::string& ptr, const std::string& vocab_ptr) {
  auto ia = m.vocab.find(a), ib = m.vocab.find(b), inew = m.vocab.find(a + b);
  if (ia == m.vocab.end()) r.fail(ptr, "merge \"" + a + " " + b + "\": \"" + a + "\" is not in " + vocab_ptr);
  if (ib == m.vocab.end()) r.fail(ptr, "merge \"" + a + " " + b + "\": \"" + b + "\" is not in " + vocab_ptr);
  if (inew == m.vocab.end())
    r.fail(ptr, "merge \"" + a + " " + b + "\": the merged \"" + a + b + "\" is not in " + vocab_ptr);
  m.merge_list.push_back({static_cast<std::int32_t>(ia->second), static_cast<std::int32_t>(ib->second),
                          static_cast<std::int32_t>(inew->second), rank});
}

}  // namespace

ByteBpeTokenizer ByteBpeTokenizer::from_tokenizer_json(const std::string& path) {
  return from_tokenizer_json_text(read_whole_file(path, "byte_bpe"), path);
}

ByteBpeTokenizer ByteBpeTokenizer::from_tokenizer_json_text(std::string_view text, const std::string& label) {
  const Reader r(label);
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw refit::Error("byte_bpe: " + label + ": not JSON: " + e.what());
  }
  r.object(j, "");
  auto m = std::make_shared<Impl>();
  m->label = label;

  // ---- model ----
  const Json& model = r.object(r.required(j, "model", ""), "/model");
  const std::string type = r.type(model, "/model");
  if (type != "BPE") r.fail("/model/type", "model \"" + type + "\" is not supported (byte-level BPE needs BPE)");
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    if (!model["dropout"].is_number())
      r.fail("/model/dropout", std::string("expected a number or null, got ") + type_name(model["dropout"]));
    if (model["dropout"].get<double>() != 0.0)
      r.fail("/model/dropout", "BPE dropout is random: refit encodes deterministically");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!model.contains(key) || model[key].is_null()) continue;
    if (r.string(model[key], pointer("/model", key)) != "")
      r.fail(pointer("/model", key), "must be null or \"\" for byte-level BPE");
  }
  if (r.boolean(model, "byte_fallback", "/model", false))
    r.fail("/model/byte_fallback", "byte_fallback is for character-level BPE (<0xNN> tokens), not byte-level");
  m->fuse_unk = r.boolean(model, "fuse_unk", "/model", false);
  m->ignore_merges = r.boolean(model, "ignore_merges", "/model", false);
  if (model.contains("unk_token") && !model["unk_token"].is_null())
    m->unk_token = r.string(model["unk_token"], "/model/unk_token");

  const Json& vocab = r.object(r.required(model, "vocab", "/model"), "/model/vocab");
  m->vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    m->vocab[it.key()] = r.id(it.value(), pointer("/model/vocab", it.key()));
  check_dense(r, *m, "/model/vocab");
  const Json& merges = r.array(r.required(model, "merges", "/model"), "/model/merges");
  m->merge_list.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const std::string mp = pointer("/model/merges", i);
    const Json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {  // the legacy "a b" form
      const std::string s = e.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        r.fail(mp, "merge \"" + s + "\" is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array()) {
      if (e.size() != 2) r.fail(mp, "a merge is a pair of tokens, got " + std::to_string(e.size()));
      a = r.string(e[0], pointer(mp, 0));
      b = r.string(e[1], pointer(mp, 1));
    } else {
      r.fail(mp, std::string("expected \"a b\" or [\"a\", \"b\"], got ") + type_name(e));
    }
    add_merge(r, *m, a, b, static_cast<std::uint32_t>(i), mp, "/model/vocab");
  }
  if (m->unk_token) {
    auto it = m->vocab.find(*m->unk_token);
    if (it != m->vocab.end()) m->unk_id = it->second;
  }

  // ---- normalizer, pre-tokenizer, post-processor, decoder ----
  if (j.contains("normalizer")) read_normalizer(r, j["normalizer"], "/normalizer", m->nfc);
  PreTokenizerSpec pre;
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    r.fail("/pre_tokenizer", "missing: byte-level BPE needs a ByteLevel pre-tokenizer");
  read_pre_tokenizer(r, j["pre_tokenizer"], "/pre_tokenizer", pre);
  if (!pre.byte_level) r.fail("/pre_tokenizer", "no ByteLevel step: not a byte-level BPE tokenizer");
  m->steps = std::move(pre.steps);
  m->add_prefix_space = pre.add_prefix_space;
  if (pre.use_regex) m->gpt2 = bpe::make_regex_splitter(bpe::kGpt2Pattern);
  bool have_template = false;
  if (j.contains("post_processor")) read_post_processor(r, j["post_processor"], "/post_processor", *m, have_template);
  // tokenizer.json names no BOS / EOS: the template's leading and trailing special tokens are.
  if (!m->prefix_ids.empty()) m->bos = m->prefix_ids.front();
  if (!m->suffix_ids.empty()) m->eos = m->suffix_ids.back();
  m->decoder = bpe::Decoder::none;
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    const std::string dt = r.type(j["decoder"], "/decoder");
    if (dt != "ByteLevel") r.fail("/decoder/type", "decoder \"" + dt + "\" is not supported (supported: ByteLevel, none)");
    m->decoder = bpe::Decoder::byte_level;
  }

  // ---- added tokens ----
  m->next_added_id = static_cast<std::int64_t>(m->vocab.size());
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    const Json& list = r.array(j["added_tokens"], "/added_tokens");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string ap = pointer("/added_tokens", i);
      const Json& t = r.object(list[i], ap);
      AddedToken a;
      a.content = r.string_at(t, "content", ap);
      (void)r.id(r.required(t, "id", ap), pointer(ap, "id"));  // checked; the id is assigned as tokenizers does
      a.special = r.boolean(t, "special", ap, false);
      a.normalized = r.boolean(t, "normalized", ap, !a.special);
      a.lstrip = r.boolean(t, "lstrip", ap, false);
      a.rstrip = r.boolean(t, "rstrip", ap, false);
      a.single_word = r.boolean(t, "single_word", ap, false);
      a.pattern = a.normalized && m->nfc ? m->normalize(a.content) : a.content;
      if (a.pattern.empty()) continue;
      m->add_token(std::move(a));
    }
    if (m->next_added_id > static_cast<std::int64_t>(2 * m->vocab.size() + 1024 + list.size()))
      r.fail("/added_tokens", "added token ids beyond the vocabulary's range");
  }
  m->finish(label);
  return ByteBpeTokenizer(std::move(m));
}

// ---- a GGUF vocabulary -----------------------------------------------------------------------------

namespace {

enum class Split { gpt2, llama3, qwen2, tekken, gpt4o, qwen35 };

struct PreName {
  const char* name;
  Split split;
  bool llama_cpp_digits;  // llama.cpp isolates each digit first (its "\p{N}" expression)
};

// transformers 5.24's GGUF_PRE_TOKENIZER_SPLITS, and the names it leaves at GPT2Tokenizer's
// ByteLevel (GPT-2's regex) that refit knows llama.cpp's treatment of.
const PreName kPreNames[] = {
    {"gpt2", Split::gpt2, false},       {"default", Split::gpt2, false},
    {"smollm", Split::gpt2, true},      {"starcoder", Split::gpt2, true},
    {"refact", Split::gpt2, true},      {"command-r", Split::gpt2, true},
    {"codeshell", Split::gpt2, true},   {"exaone", Split::gpt2, true},
    {"minerva", Split::gpt2, true},     {"llama3", Split::llama3, false},
    {"llama-v3", Split::llama3, false}, {"llama-bpe", Split::llama3, false},
    {"falcon3", Split::llama3, false},  {"falcon-h1", Split::llama3, false},
    {"pixtral", Split::llama3, false},  {"midm-2.0", Split::llama3, false},
    {"lfm2", Split::llama3, false},     {"jina-v5-nano", Split::llama3, false},
    {"dbrx", Split::llama3, false},     {"smaug-bpe", Split::llama3, false},
    {"qwen2", Split::qwen2, false},     {"deepseek-r1-qwen", Split::qwen2, false},
    {"kormo", Split::qwen2, false},     {"f2llmv2", Split::qwen2, false},
    {"megrez", Split::qwen2, false},    {"tekken", Split::tekken, false},
    {"qwen35", Split::qwen35, false},   {"gpt-4o", Split::gpt4o, false},
    {"llama4", Split::gpt4o, false},    {"kanana2", Split::gpt4o, false},
    {"talkie", Split::gpt4o, false},    {"minimax-m2", Split::gpt4o, false},
};

}  // namespace

ByteBpeTokenizer ByteBpeTokenizer::from_gguf_vocabulary(const GgufVocabulary& v, GgufPreTokenizer mode) {
  auto fail = [&](const std::string& key, const std::string& msg) -> void {
    throw refit::Error("byte_bpe: " + v.label + ": " + key + ": " + msg);
  };
  if (v.model != "gpt2")
    fail("tokenizer.ggml.model", "\"" + v.model + "\" is not a byte-level BPE vocabulary (refit reads \"gpt2\")");
  const std::string pre = v.pre.empty() ? "default" : v.pre;
  const PreName* name = nullptr;
  for (const auto& p : kPreNames)
    if (pre == p.name) name = &p;
  if (!name) {
    std::string known;
    for (const auto& p : kPreNames) known += std::string(known.empty() ? "" : ", ") + p.name;
    fail("tokenizer.ggml.pre", "\"" + pre + "\" is not a pre-tokenizer refit knows (known: " + known + ")");
  }
  if (v.tokens.empty()) fail("tokenizer.ggml.tokens", "empty");
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size())
    fail("tokenizer.ggml.token_type",
         std::to_string(v.token_types.size()) + " entries for " + std::to_string(v.tokens.size()) + " tokens");
  if (v.tokens.size() > 0x7FFFFFFFu) fail("tokenizer.ggml.tokens", "too many tokens");

  auto m = std::make_shared<Impl>();
  m->label = v.label;
  // transformers' byte_level_tokenizer: a token outside the byte alphabet is respelled from its
  // UTF-8 bytes; a token listed twice keeps its later index.
  m->vocab.reserve(v.tokens.size());
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string& t = v.tokens[i];
    m->vocab[bpe::token_to_raw(t) ? t : bpe::raw_to_token(t)] = static_cast<std::int64_t>(i);
  }
  m->merge_list.reserve(v.merges.size());
  for (std::size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& s = v.merges[i];
    const auto sp = s.find(' ');
    const std::string key = "tokenizer.ggml.merges[" + std::to_string(i) + "]";
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      fail(key, "merge \"" + s + "\" is not two tokens separated by one space");
    const std::string a = s.substr(0, sp), b = s.substr(sp + 1);
    auto ia = m->vocab.find(a), ib = m->vocab.find(b), inew = m->vocab.find(a + b);
    if (ia == m->vocab.end() || ib == m->vocab.end() || inew == m->vocab.end())
      fail(key, "merge \"" + s + "\": \"" +
                    (ia == m->vocab.end()   ? a
                     : ib == m->vocab.end() ? b
                                            : a + b) +
                    "\" is not in tokenizer.ggml.tokens");
    m->merge_list.push_back({static_cast<std::int32_t>(ia->second), static_cast<std::int32_t>(ib->second),
                             static_cast<std::int32_t>(inew->second), static_cast<std::uint32_t>(i)});
  }

  // Added tokens as transformers adds them: the special tokens it is given (bos, eos, unk, pad),
  // control tokens (type 3) spelled in the byte alphabet as special, user-defined ones (type 4)
  // present in the vocabulary as plain added tokens. None is normalised; this vocabulary has no
  // normaliser anyway.
  m->next_added_id = static_cast<std::int64_t>(m->vocab.size());
  auto id_of = [&](const std::optional<std::int64_t>& id, const char* key) -> std::optional<std::int64_t> {
    if (!id) return std::nullopt;
    if (*id < 0 || *id >= static_cast<std::int64_t>(v.tokens.size()))
      fail(key, "id " + std::to_string(*id) + " is outside the " + std::to_string(v.tokens.size()) + " tokens");
    return id;
  };
  const auto bos = id_of(v.bos, "tokenizer.ggml.bos_token_id");
  const auto eos = id_of(v.eos, "tokenizer.ggml.eos_token_id");
  const auto unk = id_of(v.unk, "tokenizer.ggml.unknown_token_id");
  const auto pad = id_of(v.pad, "tokenizer.ggml.padding_token_id");
  for (std::size_t i = 0; i < v.token_types.size(); ++i) {
    if (v.token_types[i] == 3 && bpe::token_to_raw(v.tokens[i])) {
      AddedToken a;
      a.content = v.tokens[i];
      a.special = true;
      m->add_token(std::move(a));
    }
  }
  for (const auto& id : {bos, eos, unk, pad}) {
    if (!id) continue;
    AddedToken a;
    a.content = v.tokens[static_cast<std::size_t>(*id)];
    a.special = true;
    m->add_token(std::move(a));
  }
  for (std::size_t i = 0; i < v.token_types.size(); ++i) {
    if (v.token_types[i] == 4 && m->vocab.count(v.tokens[i])) {
      AddedToken a;
      a.content = v.tokens[i];
      m->add_token(std::move(a));
    }
  }
  // The split.
  switch (name->split) {
    case Split::gpt2:
      if (mode == GgufPreTokenizer::llama_cpp && name->llama_cpp_digits) {
        PreStep st;
        st.kind = PreStep::Kind::digits;
        st.individual_digits = true;
        m->steps.push_back(std::move(st));
      }
      m->gpt2 = bpe::make_regex_splitter(bpe::kGpt2Pattern);
      break;
    default: {
      const char* pattern = name->split == Split::llama3   ? bpe::kLlama3Pattern
                            : name->split == Split::qwen2  ? bpe::kQwen2Pattern
                            : name->split == Split::tekken ? kTekkenPattern
                            : name->split == Split::gpt4o  ? kGpt4oPattern
                                                           : kQwen35Pattern;
      PreStep st;
      st.kind = PreStep::Kind::split;
      st.splitter = bpe::make_regex_splitter(pattern);
      st.behavior = SplitBehavior::isolated;
      m->steps.push_back(std::move(st));
    }
  }
  m->decoder = bpe::Decoder::byte_level;
  // TokenizersBackend's template: bos $A eos as add_bos_token / add_eos_token say.
  if (v.add_bos) {
    if (!bos) fail("tokenizer.ggml.add_bos_token", "true, but the file has no tokenizer.ggml.bos_token_id");
    m->prefix_ids.push_back(*bos);
  }
  if (v.add_eos) {
    if (!eos) fail("tokenizer.ggml.add_eos_token", "true, but the file has no tokenizer.ggml.eos_token_id");
    m->suffix_ids.push_back(*eos);
  }
  m->bos = bos;
  m->eos = eos;
  m->pad = pad;
  m->finish(v.label);
  return ByteBpeTokenizer(std::move(m));
}

}  // namespace refit::text
