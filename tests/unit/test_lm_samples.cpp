// Loss masks and packing of causal-LM samples (plugins/llm/lm_samples.h), and WordNet's gloss
// records (plugins/llm/wordnet.h).
#include <catch2/catch.hpp>

#include "llm/lm_samples.h"
#include "llm/wordnet.h"
#include "refit/error.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_lm_samples {

using namespace refit::llm;

TEST_CASE("lm samples: labels mark exactly the tokens overlapping the spans", "[lm_data]") {
  // Text "ab|cd|ef|gh" as four 2-byte tokens and an empty-range added token at the start.
  const std::vector<std::int64_t> ids{1, 10, 11, 12, 13};
  const std::vector<ByteSpan> offsets{{0, 0}, {0, 2}, {2, 4}, {4, 6}, {6, 8}};
  // The span [3, 6) cuts into the second token and covers the third.
  auto labels = labels_from_spans(ids, offsets, {{3, 6}}, false);
  CHECK(labels == std::vector<std::int64_t>{-100, -100, 11, 12, -100});
  // Two spans, one token each; the empty token never counts.
  labels = labels_from_spans(ids, offsets, {{0, 2}, {6, 8}}, false);
  CHECK(labels == std::vector<std::int64_t>{-100, 10, -100, -100, 13});
  // train_on_all: every token, the added one too.
  CHECK(labels_from_spans(ids, offsets, {}, true) == ids);
  CHECK_THROWS_AS(labels_from_spans(ids, {{0, 1}}, {}, false), refit::Error);
}

TEST_CASE("lm samples: packing keeps order, restarts positions, masks each sample's first label", "[lm_data]") {
  std::vector<TokenizedSample> samples(4);
  samples[0] = {{1, 2, 3}, {-100, 2, 3}};
  samples[1] = {{4, 5}, {4, 5}};
  samples[2] = {{6, 7, 8, 9, 10, 11}, {6, 7, 8, 9, 10, 11}};  // longer than max_length: cut
  samples[3] = {{12}, {12}};
  PackingStats stats;
  auto packs = pack_samples(samples, 5, &stats);
  REQUIRE(packs.size() == 3);
  // [1 2 3 | 4 5] fills the first; the cut sample opens the second; 12 does not fit after it.
  CHECK(packs[0].input_ids == std::vector<std::int64_t>{1, 2, 3, 4, 5});
  CHECK(packs[0].labels == std::vector<std::int64_t>{-100, 2, 3, -100, 5});
  CHECK(packs[0].position_ids == std::vector<std::int64_t>{0, 1, 2, 0, 1});
  CHECK(packs[0].segment_ids == std::vector<std::int64_t>{1, 1, 1, 2, 2});
  CHECK(packs[1].input_ids == std::vector<std::int64_t>{6, 7, 8, 9, 10});
  CHECK(packs[2].input_ids == std::vector<std::int64_t>{12});
  CHECK(packs[2].labels == std::vector<std::int64_t>{-100});
  CHECK(stats.truncated == 1);
  CHECK(stats.samples == 4);
  CHECK(stats.tokens == 11);
  CHECK(stats.fill() == Approx(11.0 / 15.0));
  // The targets (after the shift) of the packs are those of the samples, cut one excepted.
  std::size_t packed = 0;
  for (const auto& p : packs)
    for (std::size_t i = 1; i < p.labels.size(); ++i) packed += p.labels[i] != kIgnoreIndex;
  CHECK(packed == samples[0].targets() + samples[1].targets() + 4 + samples[3].targets());
  CHECK_THROWS_AS(pack_samples({{{1, 2}, {1}}}, 4), refit::Error);
}

TEST_CASE("wordnet: a synset line gives its first word and its definition without examples", "[lm_data]") {
  InstructionPair p;
  REQUIRE(parse_wordnet_line("00002137 03 n 02 abstraction 0 abstract_entity 0 010 @ 00001740 n 0000 | a general "
                             "concept formed by extracting common features from specific examples  ",
                             "a noun", p));
  CHECK(p.prompt == "What does \"abstraction\" mean as a noun?");
  CHECK(p.response ==
        "\"abstraction\" means a general concept formed by extracting common features from specific examples.");
  REQUIRE(parse_wordnet_line("00001740 00 a 01 able(p) 0 005 = 05207437 n 0000 | (usually followed by `to') having the "
                             "necessary means or skill; \"able to swim\"; \"she was able to program her computer\"  ",
                             "an adjective", p));
  CHECK(p.prompt == "What does \"able\" mean as an adjective?");
  CHECK(p.response == "\"able\" means (usually followed by `to') having the necessary means or skill.");
  CHECK(parse_wordnet_line("00001930 03 n 01 physical_entity 0 007 | an entity", "a noun", p));
  CHECK(p.prompt == "What does \"physical entity\" mean as a noun?");
  CHECK_FALSE(parse_wordnet_line("  1 This software and database is being provided", "a noun", p));
  CHECK_FALSE(parse_wordnet_line("00001930 03 n 01 x 0 000 | \"only an example\"", "a noun", p));
}

}  // namespace refit_test_lm_samples
