// The byte-level BPE tokenizer (plugins/text/byte_bpe.h) against Hugging Face `tokenizers`
// (tests/golden/make_byte_bpe.py): SmolLM2's tokenizer read from the GGUF file gives the same ids
// on every fortune record, the synthetic strings and a sweep of every code point of planes 0-3
// and 14; four tiny tokenizer.json files (Llama-3 and Qwen2 splits, NFC, templates, added tokens
// with lstrip/rstrip/normalized/single_word, ignore_merges, legacy merges, Digits, a prefix space,
// every split behaviour and invert) give the same ids and decodes; decode(encode(s)) == s; the incremental decoder matches decode on invalid
// UTF-8; the hand-written splitters match ICU's regex engine; malformed files name the file and
// the JSON pointer. No LibTorch.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "refit/error.h"
#include "text/byte_bpe.h"
#include "text/byte_bpe_impl.h"
#include "text/byte_bpe_split.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_byte_bpe {

using refit::text::ByteBpeTokenizer;
using Json = nlohmann::json;

namespace {

std::string source_dir() {
  const char* src = std::getenv("REFIT_SOURCE_DIR");
  if (!src || !*src) FAIL("REFIT_SOURCE_DIR is not set (ctest sets it)");
  return src;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot open " << path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Json& golden(const std::string& name) {
  static std::map<std::string, Json> cache;
  auto it = cache.find(name);
  if (it == cache.end())
    it = cache.emplace(name, Json::parse(read_file(source_dir() + "/tests/golden/byte_bpe/" + name))).first;
  return it->second;
}

std::string fnv1a(const std::vector<std::int64_t>& ids) {  // as make_byte_bpe.py
  std::uint64_t h = 0xCBF29CE484222325ULL;
  for (std::int64_t id : ids) {
    auto u = static_cast<std::uint64_t>(id);
    for (int b = 0; b < 8; ++b) {
      h ^= (u >> (8 * b)) & 0xFF;
      h *= 0x100000001B3ULL;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

/// Every fortune record, as make_byte_bpe.py reads them: each *.u8 file in sorted order, its
/// bytes repaired as UTF-8, split at "\n%\n", newlines stripped at both ends, empty ones skipped.
const std::vector<std::string>& fortunes() {
  static const std::vector<std::string> all = [] {
    const std::string dir = "/usr/share/games/fortunes";
    std::vector<std::string> files;
    if (std::filesystem::is_directory(dir))
      for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.path().extension() == ".u8") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    std::vector<std::string> out;
    for (const auto& f : files) {
      const std::string text = refit::text::repair_utf8(read_file(f));
      std::size_t start = 0;
      while (start <= text.size()) {
        std::size_t end = text.find("\n%\n", start);
        if (end == std::string::npos) end = text.size();
        std::string rec = text.substr(start, end - start);
        const auto a = rec.find_first_not_of('\n');
        if (a != std::string::npos) out.push_back(rec.substr(a, rec.find_last_not_of('\n') - a + 1));
        if (end == text.size()) break;
        start = end + 3;
      }
    }
    return out;
  }();
  return all;
}

std::vector<std::string> sweep_strings() {  // as make_byte_bpe.py's sweep()
  std::vector<char32_t> cps;
  for (char32_t c = 0; c < 0x40000; ++c)
    if (c < 0xD800 || c > 0xDFFF) cps.push_back(c);
  for (char32_t c = 0xE0000; c < 0xE1000; ++c) cps.push_back(c);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < cps.size(); i += 64) {
    std::string s;
    for (std::size_t k = i; k < std::min(cps.size(), i + 64); ++k) {
      std::string c;
      const char32_t cp = cps[k];
      if (cp < 0x80) c += static_cast<char>(cp);
      else if (cp < 0x800)
        c += static_cast<char>(0xC0 | (cp >> 6)), c += static_cast<char>(0x80 | (cp & 0x3F));
      else if (cp < 0x10000)
        c += static_cast<char>(0xE0 | (cp >> 12)), c += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
            c += static_cast<char>(0x80 | (cp & 0x3F));
      else
        c += static_cast<char>(0xF0 | (cp >> 18)), c += static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
            c += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), c += static_cast<char>(0x80 | (cp & 0x3F));
      s += "a" + c + "b 1" + c + "2 " + c + c + " '" + c + " ";
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string smollm2_gguf() {
  const char* p = std::getenv("REFIT_SMOLLM2_GGUF");
  if (!p || !*p)
    FAIL("REFIT_SMOLLM2_GGUF is not set: run scripts/setup.sh (scripts/env.sh exports it) and configure the "
         "build with it in the environment");
  if (!std::filesystem::is_regular_file(p)) FAIL("REFIT_SMOLLM2_GGUF=" << p << " is not a file: run scripts/setup.sh");
  return p;
}

const ByteBpeTokenizer& smollm2() {
  static const ByteBpeTokenizer t = ByteBpeTokenizer::from_gguf(refit::io::GgufFile::open(smollm2_gguf()));
  return t;
}

const ByteBpeTokenizer& tiny(const std::string& name) {
  static std::map<std::string, ByteBpeTokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end())
    it = cache
             .emplace(name, ByteBpeTokenizer::from_tokenizer_json(source_dir() + "/tests/golden/byte_bpe/tiny_" + name +
                                                                  ".tokenizer.json"))
             .first;
  return it->second;
}

std::vector<std::string> synthetic() {
  std::vector<std::string> out;
  for (const auto& r : golden("smollm2.json").at("synthetic")) out.push_back(r.at("text").get<std::string>());
  return out;
}

std::string from_hex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

/// Whether every byte of `s` has a token (SmolLM2 has none for a few control bytes, which
/// encoding drops as tokenizers does, so those strings cannot round-trip).
bool all_bytes_have_tokens(const ByteBpeTokenizer& t, const std::string& s) {
  for (unsigned char b : s) {
    const std::string one(1, static_cast<char>(b));
    const auto ids = t.encode(one, false);
    if (b < 0x80 && ids.empty()) return false;
  }
  return true;
}

std::string stream_decode(const ByteBpeTokenizer& t, const std::vector<std::int64_t>& ids, bool skip) {
  auto d = t.stream_decoder(skip);
  std::string out;
  for (std::int64_t id : ids) out += d.push(id);
  return out + d.finish();
}

}  // namespace

TEST_CASE("byte_bpe: SmolLM2 from its GGUF gives tokenizers' ids on every fortune record and decodes them back",
          "[byte_bpe]") {
  const auto& t = smollm2();
  const Json& want = golden("smollm2.json").at("fortunes");
  const auto& recs = fortunes();
  // The Debian package the fixture was made from: another corpus is not these records.
  REQUIRE(recs.size() == want.size());
  std::size_t same = 0, round_trip = 0, stream_same = 0;
  std::string first_bad;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    REQUIRE(recs[i].size() == want[i][0].get<std::size_t>());
    const auto ids = t.encode(recs[i]);
    const bool ok = ids.size() == want[i][1].get<std::size_t>() && fnv1a(ids) == want[i][2].get<std::string>();
    same += ok;
    if (!ok && first_bad.empty()) first_bad = recs[i];
    const std::string back = t.decode(ids);
    round_trip += back == recs[i];
    stream_same += stream_decode(t, ids, false) == back;
  }
  INFO("first record that differs: " << first_bad);
  CHECK(same == recs.size());
  CHECK(round_trip == recs.size());
  CHECK(stream_same == recs.size());
  WARN("SmolLM2: " << same << " of " << recs.size() << " fortune records give tokenizers' ids");
}

TEST_CASE("byte_bpe: SmolLM2 gives tokenizers' ids on code and emoji and CJK and whitespace and digits and contractions "
          "and special tokens",
          "[byte_bpe]") {
  const auto& t = smollm2();
  std::size_t same = 0, n = 0;
  for (const auto& r : golden("smollm2.json").at("synthetic")) {
    const std::string s = r.at("text").get<std::string>();
    const auto want = r.at("ids").get<std::vector<std::int64_t>>();
    const auto got = t.encode(s);
    if (got != want) {
      UNSCOPED_INFO("differs: " << Json(s).dump());
    }
    same += got == want;
    ++n;
    if (all_bytes_have_tokens(t, s)) {
      CHECK(t.decode(got) == s);
    }
  }
  CHECK(same == n);
  // Special tokens are skipped on request; <|im_end|> is one id wherever it stands.
  const auto im_end = t.token_to_id("<|im_end|>");
  REQUIRE(im_end);
  CHECK(t.is_special(*im_end));
  CHECK(t.decode(t.encode("a<|im_end|>b"), true) == "ab");
  CHECK(t.eos_id() == im_end);
  CHECK(t.bos_id() == t.token_to_id("<|im_start|>"));
  CHECK(t.vocab_size() == 49152);
}

TEST_CASE("byte_bpe: SmolLM2 gives tokenizers' ids on every code point of planes 0-3 and 14", "[byte_bpe]") {
  const auto& t = smollm2();
  const Json& want = golden("smollm2.json").at("sweep");
  const auto strings = sweep_strings();
  REQUIRE(strings.size() == want.size());
  std::size_t same = 0;
  for (std::size_t i = 0; i < strings.size(); ++i) {
    const auto ids = t.encode(strings[i]);
    const bool ok = ids.size() == want[i][0].get<std::size_t>() && fnv1a(ids) == want[i][1].get<std::string>();
    if (!ok) UNSCOPED_INFO("sweep string " << i << " differs (code points from " << i * 64 << ")");
    same += ok;
  }
  CHECK(same == strings.size());
}

TEST_CASE("byte_bpe: invalid UTF-8 input reads as its U+FFFD repair and decode and the stream decoder give tokenizers' "
          "replacement characters",
          "[byte_bpe]") {
  const auto& t = smollm2();
  for (const auto& r : golden("smollm2.json").at("invalid_inputs")) {
    const std::string bytes = from_hex(r.at("hex").get<std::string>());
    CHECK(t.encode(bytes) == r.at("ids").get<std::vector<std::int64_t>>());
  }
  for (const auto& r : golden("smollm2.json").at("invalid_decodes")) {
    const auto ids = r.at("ids").get<std::vector<std::int64_t>>();
    const std::string want = r.at("decoded").get<std::string>(), want_skip = r.at("decoded_skip_special").get<std::string>();
    CHECK(t.decode(ids, false) == want);
    CHECK(t.decode(ids, true) == want_skip);
    CHECK(stream_decode(t, ids, false) == want);
    CHECK(stream_decode(t, ids, true) == want_skip);
  }
  // The stream emits only complete characters: € arriving byte by byte appears with its last byte.
  auto d = t.stream_decoder();
  const auto euro = t.encode("\xE2\x82\xAC", false);
  std::string bytes;
  for (auto id : euro) bytes += *t.token_bytes(id);
  REQUIRE(bytes == "\xE2\x82\xAC");
  using refit::text::bpe::raw_to_token;  // a byte's token, spelled in GPT-2's byte alphabet
  CHECK(d.push(*t.token_to_id(raw_to_token("\xE2"))).empty());
  CHECK(d.push(*t.token_to_id(raw_to_token("\x82"))).empty());
  CHECK(d.push(*t.token_to_id(raw_to_token("\xAC"))) == "\xE2\x82\xAC");
  CHECK(d.finish().empty());
  // repair_utf8 on its own: one U+FFFD per maximal invalid subpart.
  CHECK(refit::text::repair_utf8("a\xE2\x82z") == "a\xEF\xBF\xBDz");
  CHECK(refit::text::repair_utf8("\xF0\x9F\x98") == "\xEF\xBF\xBD");
  CHECK(refit::text::repair_utf8("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(refit::text::repair_utf8("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_CASE("byte_bpe: from_gguf with llama.cpp's split gives the ids of the digits-first pre-tokenizer", "[byte_bpe]") {
  const auto t =
      ByteBpeTokenizer::from_gguf(refit::io::GgufFile::open(smollm2_gguf()), refit::text::GgufPreTokenizer::llama_cpp);
  const Json& want = golden("smollm2.json").at("llama_cpp_smollm_ids");
  const auto texts = synthetic();
  REQUIRE(texts.size() == want.size());
  std::size_t same = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) same += t.encode(texts[i]) == want[i].get<std::vector<std::int64_t>>();
  CHECK(same == texts.size());
  CHECK(t.encode("123", false).size() == 3);  // one digit each
}

TEST_CASE("byte_bpe: tiny tokenizer.json files (Llama-3 and Qwen2 splits with NFC and templates and added tokens and "
          "Digits and a prefix space and legacy merges and every split behaviour) give tokenizers' ids and decodes",
          "[byte_bpe]") {
  const auto texts = synthetic();
  const auto& recs = fortunes();
  for (const char* name : {"a", "b", "c", "d"}) {
    INFO("tiny_" << name << ".tokenizer.json");
    const auto& t = tiny(name);
    const Json& g = golden("tiny.json").at("tokenizers").at(name);
    std::size_t same = 0, n = 0;
    auto check = [&](const std::string& s, const Json& r) {
      const auto ids = t.encode(s, true);
      bool ok;
      if (r.contains("ids")) ok = ids == r["ids"].get<std::vector<std::int64_t>>();
      else
        ok = ids.size() == r.at("n").get<std::size_t>() && fnv1a(ids) == r.at("hash").get<std::string>();
      const auto ids0 = t.encode(s, false);
      if (r.contains("ids_no_special")) {
        const Json& w = r["ids_no_special"];
        ok = ok && (w.is_string() ? fnv1a(ids0) == w.get<std::string>() : ids0 == w.get<std::vector<std::int64_t>>());
      } else {
        ok = ok && ids0 == ids;
      }
      const std::string d1 = r.contains("decoded") ? r["decoded"].get<std::string>() : s;
      const std::string d2 = r.contains("decoded_skip_special") ? r["decoded_skip_special"].get<std::string>() : d1;
      ok = ok && t.decode(ids, false) == d1 && t.decode(ids, true) == d2 && stream_decode(t, ids, true) == d2;
      if (!ok) UNSCOPED_INFO("differs: " << Json(s).dump());
      same += ok;
      ++n;
    };
    const Json& syn = g.at("synthetic");
    REQUIRE(syn.size() == texts.size());
    for (std::size_t i = 0; i < texts.size(); ++i) check(texts[i], syn[i]);
    for (const auto& r : g.at("fortunes")) check(recs.at(r.at("index").get<std::size_t>()), r);
    CHECK(same == n);
  }
  // The template's BOS/EOS (tiny_a): <s> ... </s>, named by the template.
  const auto& a = tiny("a");
  const auto ids = a.encode("hi");
  REQUIRE(ids.size() >= 2);
  CHECK(ids.front() == a.token_to_id("<s>"));
  CHECK(ids.back() == a.token_to_id("</s>"));
  CHECK(a.bos_id() == a.token_to_id("<s>"));
}

TEST_CASE("byte_bpe: the hand-written GPT-2 and Llama-3 and Qwen2 splitters find the pieces ICU's regex engine finds",
          "[byte_bpe]") {
  using namespace refit::text::bpe;
  // Characters of every class the patterns distinguish: letters (ASCII, accented, CJK, long s),
  // digits (ASCII, Arabic-Indic, superscript), spaces (ASCII, tab, \r \n, NBSP, U+3000, U+0085,
  // vertical tab), apostrophes and contraction letters, punctuation, emoji, marks.
  const std::vector<std::string> alphabet = {"a",
                                             "s",
                                             "t",
                                             "r",
                                             "e",
                                             "v",
                                             "m",
                                             "l",
                                             "d",
                                             "S",
                                             "T",
                                             "R",
                                             "E",
                                             "L",
                                             "D",
                                             "M",
                                             "V",
                                             "\xC5\xBF",
                                             "\xC3\xA9",
                                             "\xE4\xB8\xAD",
                                             "1",
                                             "2",
                                             "3",
                                             "\xD9\xA3",
                                             "\xC2\xB2",
                                             " ",
                                             " ",
                                             " ",
                                             "\t",
                                             "\r",
                                             "\n",
                                             "\xC2\xA0",
                                             "\xE3\x80\x80",
                                             "\xC2\x85",
                                             "\x0B",
                                             "'",
                                             "'",
                                             "\xE2\x80\x99",
                                             ".",
                                             "!",
                                             "-",
                                             "(",
                                             "\xF0\x9F\x98\x80",
                                             "\xCC\x81",
                                             "_",
                                             "\x7F"};
  std::mt19937 rng(33);
  for (const char* pattern : {kGpt2Pattern, kLlama3Pattern, kQwen2Pattern}) {
    INFO(pattern);
    const auto fast = make_regex_splitter(pattern);
    const auto icu = make_regex_splitter(pattern, /*force_icu=*/true);
    for (int k = 0; k < 3000; ++k) {
      std::string s;
      const int len = std::uniform_int_distribution<int>(0, 24)(rng);
      for (int i = 0; i < len; ++i) s += alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
      std::vector<Match> a, b;
      fast->find(s, a);
      icu->find(s, b);
      std::vector<std::pair<std::uint32_t, std::uint32_t>> pa, pb;
      for (auto m : a) pa.emplace_back(m.start, m.end);
      for (auto m : b) pb.emplace_back(m.start, m.end);
      if (pa != pb) FAIL_CHECK("pieces differ on " << Json(s).dump());
    }
  }
}

TEST_CASE("byte_bpe: one tokenizer serves many threads at once with the results of one", "[byte_bpe]") {
  const auto& t = tiny("a");
  const auto& recs = fortunes();
  std::vector<std::vector<std::int64_t>> want;
  for (std::size_t i = 0; i < 2000; ++i) want.push_back(t.encode(recs[i * 7 % recs.size()]));
  std::vector<std::size_t> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th)
    threads.emplace_back([&, th] {
      for (std::size_t i = 0; i < want.size(); ++i)
        wrong[th] += t.encode(recs[(i + 500 * th) % want.size() * 7 % recs.size()]) != want[(i + 500 * th) % want.size()];
    });
  for (auto& th : threads) th.join();
  for (auto w : wrong) CHECK(w == 0);
}

TEST_CASE("byte_bpe: a malformed tokenizer.json is an error naming the file and the JSON pointer", "[byte_bpe]") {
  const Json good = Json::parse(read_file(source_dir() + "/tests/golden/byte_bpe/tiny_b.tokenizer.json"));
  auto error_of = [](const Json& j) -> std::string {
    try {
      ByteBpeTokenizer::from_tokenizer_json_text(j.dump(), "bad.json");
    } catch (const refit::Error& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK(error_of(good) == "no error");
  {
    Json j = good;
    j["model"].erase("merges");
    CHECK_THAT(error_of(j), Catch::Contains("bad.json: /model/merges: missing"));
  }
  {
    Json j = good;
    j["model"]["merges"][3] = Json::array({"nosuchtoken", "e"});
    CHECK_THAT(error_of(j),
               Catch::Contains(
                   "bad.json: /model/merges/3: merge \"nosuchtoken e\": \"nosuchtoken\" is not in /model/vocab"));
  }
  {
    Json j = good;
    j["model"]["merges"][0] = "a b c";
    CHECK_THAT(error_of(j), Catch::Contains("bad.json: /model/merges/0: merge \"a b c\" is not two tokens"));
  }
  {
    Json j = good;
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
    CHECK_THAT(error_of(j),
               Catch::Contains("bad.json: /pre_tokenizer/pretokenizers/0/pattern/Regex: the regex does not compile"));
  }
  {
    Json j = good;
    j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Metaspace";
    CHECK_THAT(error_of(j),
               Catch::Contains(
                   "bad.json: /pre_tokenizer/pretokenizers/0/type: pre-tokenizer \"Metaspace\" is not supported"));
  }
  {
    Json j = good;
    j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
    CHECK_THAT(error_of(j), Catch::Contains("/pre_tokenizer/pretokenizers/0/behavior: unknown split behavior \"Sideways\""));
  }
  {
    Json j = good;
    j["model"]["vocab"]["a"] = "seven";
    CHECK_THAT(error_of(j), Catch::Contains("bad.json: /model/vocab/a: expected an id (an integer >= 0), got string"));
  }
  {
    Json j = good;
    j["model"]["type"] = "WordPiece";
    CHECK_THAT(error_of(j), Catch::Contains("/model/type: model \"WordPiece\" is not supported"));
  }
  {
    Json j = good;
    j["normalizer"] = {{"type", "Lowercase"}};
    CHECK_THAT(error_of(j), Catch::Contains("/normalizer/type: normalizer \"Lowercase\" is not supported"));
  }
  {
    Json j = good;
    j["added_tokens"][0]["special"] = "yes";
    CHECK_THAT(error_of(j), Catch::Contains("/added_tokens/0/special: expected true or false, got string"));
  }
  {
    Json j = good;
    j["model"]["vocab"]["a"] = 4000000000LL;
    CHECK_THAT(error_of(j), Catch::Contains("/model/vocab/a: id 4000000000 is beyond"));
  }
  CHECK_THAT(error_of(Json::array()), Catch::Contains("bad.json: /: expected an object"));
  try {
    ByteBpeTokenizer::from_tokenizer_json_text("{\"model\": ", "trunc.json");
    FAIL("no error");
  } catch (const refit::Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("trunc.json: not JSON"));
  }
  CHECK_THROWS_WITH(ByteBpeTokenizer::from_tokenizer_json("/nonexistent/tokenizer.json"),
                    Catch::Contains("cannot open /nonexistent/tokenizer.json"));
}

TEST_CASE("byte_bpe: a GGUF vocabulary with an unknown pre-tokenizer or another model is refused by name", "[byte_bpe]") {
  ByteBpeTokenizer::GgufVocabulary v;
  v.label = "x.gguf";
  v.model = "gpt2";
  v.pre = "mystery";
  v.tokens = {"a", "b", "ab"};
  v.merges = {"a b"};
  CHECK_THROWS_WITH(ByteBpeTokenizer::from_gguf_vocabulary(v),
                    Catch::Contains("x.gguf: tokenizer.ggml.pre: \"mystery\" is not a pre-tokenizer refit knows"));
  v.pre = "qwen2";
  v.model = "llama";
  CHECK_THROWS_WITH(ByteBpeTokenizer::from_gguf_vocabulary(v), Catch::Contains("tokenizer.ggml.model: \"llama\""));
  v.model = "gpt2";
  v.merges = {"a c"};
  CHECK_THROWS_WITH(ByteBpeTokenizer::from_gguf_vocabulary(v), Catch::Contains("tokenizer.ggml.merges[0]"));
  v.merges = {"a b"};
  const auto t = ByteBpeTokenizer::from_gguf_vocabulary(v);
  CHECK(t.encode("ab") == std::vector<std::int64_t>{2});
}

TEST_CASE("byte_bpe: without a decoder the stream decoder joins tokens with spaces, as decode() does") {
  // Found by the tokenizer.json fuzz target: with "decoder": null, decode() joins the tokens by
  // spaces (tokenizers' rule) while the stream decoder concatenated them.
  Json j = Json::parse(read_file(source_dir() + "/tests/golden/byte_bpe/tiny_a.tokenizer.json"));
  j["decoder"] = nullptr;
  const auto tok = ByteBpeTokenizer::from_tokenizer_json_text(j.dump(), "tiny_a without a decoder");
  const auto ids = tok.encode("Hello world 12345 caf\xc3\xa9", false);
  REQUIRE(ids.size() > 2);
  for (bool skip : {false, true}) {
    auto stream = tok.stream_decoder(skip);
    std::string pieces;
    for (auto id : ids) pieces += stream.push(id);
    pieces += stream.finish();
    CHECK(pieces == tok.decode(ids, skip));
  }
  CHECK(tok.decode(ids, false).find(' ') != std::string::npos);
}

}  // namespace refit_test_byte_bpe
