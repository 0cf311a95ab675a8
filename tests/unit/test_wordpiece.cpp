// The WordPiece tokenizer (plugins/text): every line of the golden corpus gives the ids, token
// type ids and attention mask of Hugging Face's BertTokenizerFast for all-MiniLM-L6-v2
// (tests/golden/make_wordpiece.py); one tokenizer serves many threads at once; the algorithm's
// rules on a small vocabulary; missing files are errors that name them.
// No LibTorch here: the tokenizer has none.
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "text/wordpiece.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_wordpiece {

using refit::text::Encoding;
using refit::text::WordPieceConfig;
using refit::text::WordPieceTokenizer;
using namespace std::string_literals;

namespace {

/// all-MiniLM-L6-v2's folder: scripts/setup.sh installs it, scripts/env.sh exports it and
/// tests/CMakeLists.txt hands it to ctest. Missing is a failure, not a skip.
std::string minilm_dir() {
  const char* dir = std::getenv("REFIT_MINILM_DIR");
  if (!dir || !*dir)
    FAIL("REFIT_MINILM_DIR is not set: run scripts/setup.sh (scripts/env.sh exports it) and "
         "configure the build with it in the environment");
  if (!std::ifstream(std::string(dir) + "/vocab.txt").good())
    FAIL("REFIT_MINILM_DIR=" << dir << " has no vocab.txt: run scripts/setup.sh");
  return dir;
}

const WordPieceTokenizer& minilm() {
  static const WordPieceTokenizer t = WordPieceTokenizer::from_directory(minilm_dir());
  return t;
}

struct Record {
  std::string text, pair;
  bool has_pair = false;
  std::optional<std::size_t> max_length;
  Encoding want;
};

std::vector<Record> golden() {
  const char* src = std::getenv("REFIT_SOURCE_DIR");
  REQUIRE(src);
  const std::string path = std::string(src) + "/tests/golden/wordpiece/minilm.jsonl";
  std::ifstream in(path);
  if (!in) FAIL("cannot open " << path);
  std::vector<Record> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("meta")) continue;
    Record r;
    r.text = j.at("text").get<std::string>();
    if (j.contains("pair")) r.pair = j["pair"].get<std::string>(), r.has_pair = true;
    if (!j.at("max_length").is_null()) r.max_length = j["max_length"].get<std::size_t>();
    r.want.input_ids = j.at("input_ids").get<std::vector<std::int64_t>>();
    r.want.token_type_ids = j.at("token_type_ids").get<std::vector<std::int64_t>>();
    r.want.attention_mask = j.at("attention_mask").get<std::vector<std::int64_t>>();
    out.push_back(std::move(r));
  }
  return out;
}

Encoding encode(const WordPieceTokenizer& t, const Record& r) {
  return r.has_pair ? t.encode_pair(r.text, r.pair, r.max_length) : t.encode(r.text, r.max_length);
}

bool same(const Encoding& a, const Encoding& b) {
  return a.input_ids == b.input_ids && a.token_type_ids == b.token_type_ids && a.attention_mask == b.attention_mask;
}

std::string ids(const std::vector<std::int64_t>& v) {
  std::ostringstream s;
  for (auto i : v) s << i << ' ';
  return s.str();
}

WordPieceTokenizer small(WordPieceConfig c = {}) {
  std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##want", "##ed", "runn", "##ing",
                                    ",",     "want",  "a",     "##a",   "b",      "c",  "d",      "e",    "##b",  "."};
  c.special_tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  return WordPieceTokenizer(std::move(vocab), std::move(c));
}

}  // namespace

TEST_CASE("wordpiece: every golden line matches BertTokenizerFast (all-MiniLM-L6-v2)", "[wordpiece]") {
  const auto& t = minilm();
  CHECK(t.vocab_size() == 30522);
  CHECK(t.config().model_max_length == 512);
  const auto records = golden();
  REQUIRE(records.size() >= 500);
  std::size_t wrong = 0;
  for (const auto& r : records) {
    const Encoding got = encode(t, r);
    if (same(got, r.want)) continue;
    if (++wrong <= 10)
      UNSCOPED_INFO("text " << nlohmann::json(r.text).dump() << (r.has_pair ? " pair " + nlohmann::json(r.pair).dump() : "")
                            << " max_length " << (r.max_length ? std::to_string(*r.max_length) : "none") << "\n  got  "
                            << ids(got.input_ids) << "| " << ids(got.token_type_ids) << "\n  want " << ids(r.want.input_ids)
                            << "| " << ids(r.want.token_type_ids));
  }
  INFO(wrong << " of " << records.size() << " records differ");
  CHECK(wrong == 0);
}

TEST_CASE("wordpiece: one tokenizer encodes from many threads at once", "[wordpiece]") {
  const auto& t = minilm();
  const auto records = golden();
  std::vector<Encoding> want;
  for (const auto& r : records) want.push_back(encode(t, r));
  std::vector<std::size_t> wrong(4, 0);
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < wrong.size(); ++k)
    threads.emplace_back([&, k] {
      for (int round = 0; round < 3; ++round)
        for (std::size_t i = 0; i < records.size(); ++i) {
          const std::size_t j = (i * 7 + k * 131) % records.size();  // threads in different places
          if (!same(encode(t, records[j]), want[j])) ++wrong[k];
        }
    });
  for (auto& th : threads) th.join();
  for (std::size_t w : wrong) CHECK(w == 0);
}

TEST_CASE("wordpiece: greedy longest match, ## pieces, unknown words, special tokens", "[wordpiece]") {
  const auto t = small();
  using V = std::vector<std::string>;
  CHECK(t.tokenize("UNwant\u00E9d,running") == V{"un", "##want", "##ed", ",", "runn", "##ing"});
  CHECK(t.tokenize("unwantedX running") == V{"[UNK]", "runn", "##ing"});  // one bad piece: the whole word
  CHECK(t.tokenize("aaab") == V{"a", "##a", "##a", "##b"});
  CHECK(t.tokenize("a[SEP]b [MASK][mask]") == V{"a", "[SEP]", "b", "[MASK]", "[UNK]", "[UNK]", "[UNK]"});
  CHECK(t.pre_tokenize(" Hello,\tWORLD\u3000x\u00A0y\0z\u200Bw [CLS]"s) ==
        V{"hello", ",", "world", "x", "yzw", "[CLS]"});  // NUL and U+200B (Cf) dropped, not spaces
  CHECK(t.pre_tokenize("\u4E2D\u6587ab") == V{"\u4E2D", "\u6587", "ab"});
  CHECK(t.tokenize(std::string(100, 'a')).size() == 100);
  CHECK(t.tokenize(std::string(101, 'a')) == V{"[UNK]"});  // over max_input_chars_per_word

  WordPieceConfig cased;
  cased.lowercase = false;
  CHECK(small(cased).pre_tokenize("Caf\u00E9") == V{"Caf\u00E9"});  // no lower-casing, no stripping
  cased.strip_accents = true;
  CHECK(small(cased).pre_tokenize("Caf\u00E9") == V{"Cafe"});
}

TEST_CASE("wordpiece: [CLS] A [SEP] B [SEP], type ids and longest_first truncation", "[wordpiece]") {
  const auto t = small();
  const Encoding one = t.encode("a b c");
  CHECK(one.input_ids == std::vector<std::int64_t>{2, 12, 14, 15, 3});
  CHECK(one.token_type_ids == std::vector<std::int64_t>(5, 0));
  CHECK(one.attention_mask == std::vector<std::int64_t>(5, 1));
  CHECK(t.encode("a b c", 4).input_ids == std::vector<std::int64_t>{2, 12, 14, 3});
  CHECK(t.encode("a b c", 2).input_ids == std::vector<std::int64_t>{2, 3});
  CHECK_THROWS_WITH(t.encode("a", 1), Catch::Contains("max_length 1"));

  const Encoding pair = t.encode_pair("a b", "c");
  CHECK(pair.input_ids == std::vector<std::int64_t>{2, 12, 14, 3, 15, 3});
  CHECK(pair.token_type_ids == std::vector<std::int64_t>{0, 0, 0, 0, 1, 1});
  // tokenizers' own cases (utils/truncation.rs) at max_length 7 + 3 special tokens.
  auto lengths = [&](int n1, int n2) {
    std::string x, y;
    for (int i = 0; i < n1; ++i) x += "a ";
    for (int i = 0; i < n2; ++i) y += "b ";
    const Encoding e = t.encode_pair(x, y, 10);
    std::size_t first = 0;
    while (e.input_ids[1 + first] != 3) ++first;
    return std::pair<std::size_t, std::size_t>(first, e.input_ids.size() - first - 3);
  };
  using P = std::pair<std::size_t, std::size_t>;
  CHECK(lengths(0, 8) == P{0, 7});
  CHECK(lengths(2, 8) == P{2, 5});
  CHECK(lengths(4, 4) == P{3, 4});
  CHECK(lengths(4, 8) == P{3, 4});
  CHECK(lengths(8, 2) == P{5, 2});
  CHECK(lengths(8, 4) == P{4, 3});
  CHECK(lengths(8, 8) == P{3, 4});
  CHECK(lengths(2, 2) == P{2, 2});
}

TEST_CASE("wordpiece: missing or unusable files are errors naming them", "[wordpiece]") {
  CHECK_THROWS_WITH(WordPieceTokenizer::from_directory("/nonexistent/minilm"),
                    Catch::Contains("/nonexistent/minilm/vocab.txt"));
  WordPieceConfig c;
  c.unk_token = "[NOPE]";
  CHECK_THROWS_WITH(small(c), Catch::Contains("[NOPE]"));
  CHECK_THROWS_AS(small().id_to_token(1000), std::out_of_range);
}

}  // namespace refit_test_wordpiece
