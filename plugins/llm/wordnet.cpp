#include "llm/wordnet.h"

#include <fstream>

#include "refit/error.h"

namespace refit::llm {

namespace {

const char* pos_name(const std::string& part) {
  if (part == "noun") return "a noun";
  if (part == "verb") return "a verb";
  if (part == "adj") return "an adjective";
  if (part == "adv") return "an adverb";
  return nullptr;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

bool parse_wordnet_line(const std::string& line, const std::string& pos, InstructionPair& out) {
  // synset_offset lex_filenum ss_type w_cnt word lex_id [word lex_id ...] p_cnt ... | gloss
  const auto bar = line.find(" | ");
  if (bar == std::string::npos) return false;
  std::size_t p = 0;
  auto field = [&]() -> std::string {
    while (p < bar && line[p] == ' ') ++p;
    const auto start = p;
    while (p < bar && line[p] != ' ') ++p;
    return line.substr(start, p - start);
  };
  const std::string offset = field(), lex_filenum = field(), ss_type = field(), w_cnt = field();
  if (offset.empty() || w_cnt.empty()) return false;
  std::size_t words = 0;
  try {
    words = std::stoul(w_cnt, nullptr, 16);  // two hexadecimal digits
  } catch (const std::exception&) {
    return false;
  }
  if (words == 0) return false;
  std::string word = field();
  if (word.empty()) return false;
  // Adjectives carry a syntactic marker: "able(p)".
  if (const auto paren = word.find('('); paren != std::string::npos) word.resize(paren);
  for (char& c : word)
    if (c == '_') c = ' ';
  std::string gloss = line.substr(bar + 3);
  // The definition ends where the first quoted example begins ("; \"").
  if (const auto ex = gloss.find("; \""); ex != std::string::npos) gloss.resize(ex);
  gloss = trim(gloss);
  if (!gloss.empty() && gloss.front() == '"') return false;  // examples only, no definition
  if (gloss.empty()) return false;
  out.prompt = "What does \"" + word + "\" mean as " + pos + "?";
  out.response = "\"" + word + "\" means " + gloss + ".";
  return true;
}

std::vector<InstructionPair> read_wordnet(const WordNetOptions& options) {
  std::vector<InstructionPair> pairs;
  for (const auto& part : options.parts) {
    const char* pos = pos_name(part);
    if (!pos) throw Error("wordnet: unknown part of speech \"" + part + "\" (expected noun, verb, adj or adv)");
    const std::string file = options.dir + "/data." + part;
    std::ifstream in(file);
    if (!in) throw Error("wordnet: cannot read " + file + " (Debian: apt-get install wordnet-base; or set \"dir\")");
    std::string line;
    std::size_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.rfind("  ", 0) == 0) continue;  // the license header
      InstructionPair pair;
      if (!parse_wordnet_line(line, pos, pair)) {
        if (line.find(" | ") == std::string::npos)
          throw Error("wordnet: " + file + " line " + std::to_string(number) + " is not a synset record");
        continue;
      }
      // The definition without the word's own sentence frame: keep short ones.
      const auto def_chars = pair.response.size();
      if (def_chars > options.max_definition_chars) continue;
      pairs.push_back(std::move(pair));
    }
  }
  return pairs;
}

}  // namespace refit::llm
