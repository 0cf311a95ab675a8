// The SDK's tokenizer interface (refit/tokenizer.h) over both implementations: BERT's WordPiece
// through WordPieceAdapter (ids as WordPieceTokenizer gives them, decode as tokenizers'
// WordPiece decoder does for all-MiniLM-L6-v2; expected strings from BertTokenizerFast's backend,
// transformers 5.24.0 / tokenizers 0.23.3) and byte-level BPE. No LibTorch.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "refit/tokenizer.h"
#include "text/byte_bpe.h"
#include "text/wordpiece_tokenizer.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_tokenizer_interface {

namespace {

std::string minilm_dir() {
  const char* dir = std::getenv("REFIT_MINILM_DIR");
  if (!dir || !*dir) FAIL("REFIT_MINILM_DIR is not set: run scripts/setup.sh (scripts/env.sh exports it)");
  return dir;
}

}  // namespace

TEST_CASE("tokenizer interface: WordPiece behind refit::Tokenizer encodes as WordPieceTokenizer and decodes as "
          "tokenizers' WordPiece decoder",
          "[tokenizer]") {
  auto wp =
      std::make_shared<const refit::text::WordPieceTokenizer>(refit::text::WordPieceTokenizer::from_directory(minilm_dir()));
  const std::unique_ptr<refit::Tokenizer> t = std::make_unique<refit::text::WordPieceAdapter>(wp);
  struct Case {
    std::string text;
    std::vector<std::int64_t> ids;
    std::string decoded, skipped;
  };
  const std::vector<Case> cases = {
      {"Hello, world! Isn't it great? I'm sure they've said we're done.",
       {101,  7592, 1010, 2088, 999,  3475, 1005, 1056, 2009, 2307, 1029, 1045, 1005,
        1049, 2469, 2027, 1005, 2310, 2056, 2057, 1005, 2128, 2589, 1012, 102},
       "[CLS] hello, world! isn ' t it great? i ' m sure they ' ve said we ' re done. [SEP]",
       "hello, world! isn ' t it great? i ' m sure they ' ve said we ' re done."},
      {"tokenization of unaffable words [MASK] here",
       {101, 19204, 3989, 1997, 14477, 20961, 3468, 2616, 103, 2182, 102},
       "[CLS] tokenization of unaffable words [MASK] here [SEP]",
       "tokenization of unaffable words here"},
      {"do not stop ' quote ' x",
       {101, 2079, 2025, 2644, 1005, 14686, 1005, 1060, 102},
       "[CLS] do not stop ' quote ' x [SEP]",
       "do not stop ' quote ' x"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    CHECK(t->encode(c.text, true) == c.ids);
    CHECK(t->encode(c.text, false) == std::vector<std::int64_t>(c.ids.begin() + 1, c.ids.end() - 1));
    CHECK(t->decode(c.ids, false) == c.decoded);
    CHECK(t->decode(c.ids, true) == c.skipped);
  }
  CHECK(t->vocab_size() == 30522);
  CHECK(t->token_to_id("[SEP]") == 102);
  CHECK(t->id_to_token(7592) == "hello");
  CHECK(!t->id_to_token(30522));
  CHECK(t->bos_id() == 101);
  CHECK(t->eos_id() == 102);
  CHECK(t->pad_id() == 0);
  CHECK(!t->token_bytes(7592));  // WordPiece does not keep the text's bytes
}

}  // namespace refit_test_tokenizer_interface
