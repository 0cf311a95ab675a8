#pragma once
// WordNet's glosses as instruction pairs, for the chat fine-tuning recipe (recipes/llm/): Debian's
// `wordnet-base` ships the Princeton WordNet 3.0 database (/usr/share/wordnet/data.{noun,verb,
// adj,adv}); every synset line holds its words and, after " | ", its gloss: a definition, often
// followed by quoted examples ("a person who ...; \"he is a good teacher\""). Each synset gives one
// pair: "What does \"<first word>\" mean?" -> the definition (without the examples), with the part
// of speech named ("as a noun"). No LibTorch: plain strings.
#include <cstddef>
#include <string>
#include <vector>

namespace refit::llm {

struct InstructionPair {
  std::string prompt, response;
};

struct WordNetOptions {
  std::string dir = "/usr/share/wordnet";
  /// Parts of speech, by file: "noun", "verb", "adj", "adv".
  std::vector<std::string> parts{"noun", "verb", "adj", "adv"};
  /// Synsets whose definition is longer are left out (keeps samples short for a CPU recipe).
  std::size_t max_definition_chars = 160;
};

/// The pairs of every synset of `parts`, in file order (a synset of several files keeps each).
/// Throws refit::Error naming the file and line of a line that is not a synset record (a
/// license header's lines, which start with two spaces, are skipped).
std::vector<InstructionPair> read_wordnet(const WordNetOptions& options);

/// One synset line -> its pair; `pos` names the part of speech in the prompt. Exposed for tests.
/// Returns false for a line without a gloss.
bool parse_wordnet_line(const std::string& line, const std::string& pos, InstructionPair& out);

}  // namespace refit::llm
