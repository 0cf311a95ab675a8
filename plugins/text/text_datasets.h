#pragma once
// Text classification datasets: records of a text (or a text pair) and a class, tokenized for a
// BERT-family model by the WordPiece tokenizer (wordpiece.h) when the loader asks for a sample
// — in its worker threads — so nothing is tokenized ahead. Every sample has the fields
// "input_ids" and "token_type_ids" (variable length: padded per batch with the tokenizer's pad id
// and 0; their mask is "attention_mask") and, when the records have classes, "labels".
//
//   "fortunes":   Debian's fortunes corpus (/usr/share/games/fortunes, records between lines
//                 holding "%"), one class per chosen category file
//   "text_csv":   a CSV file with a header (RFC 4180 quoting), a text column (and a pair column)
//                 and a label column (optional: texts to predict on need none)
//   "text_jsonl": one JSON object per line with the same keys
//
// Each takes "tokenizer" (a folder with vocab.txt and tokenizer_config.json), "max_length"
// (truncation, special tokens included), and a seeded split of its records: "split": {"part":
// "train" | "val" | "test", "fractions": [train, val, test], "seed": s}; the three parts never
// overlap and cover every record.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/dataset.h"
#include "text/split.h"
#include "text/wordpiece.h"

namespace refit::text {

struct TextRecord {
  std::string text, pair;  // pair: "" for single texts
  std::int64_t label = 0;  // unused when the dataset has no labels
};

class TextDataset : public Dataset {
 public:
  /// `class_names` empty: unlabelled texts (no "labels" field, num_classes() -1).
  TextDataset(std::string name, std::vector<TextRecord> records, std::vector<std::string> class_names,
              std::shared_ptr<const WordPieceTokenizer> tokenizer, std::int64_t max_length,
              std::string max_length_from = "");
  std::int64_t size() const override { return static_cast<std::int64_t>(records_.size()); }
  std::vector<FieldInfo> fields() const override;
  Example get(std::int64_t index) const override;
  std::int64_t num_classes() const override { return labelled() ? static_cast<std::int64_t>(class_names_.size()) : -1; }
  std::string describe() const override;
  bool labelled() const { return !class_names_.empty(); }
  std::vector<std::string> class_names() const override { return class_names_; }

 private:
  std::string name_;
  std::vector<TextRecord> records_;
  std::vector<std::string> class_names_;
  std::shared_ptr<const WordPieceTokenizer> tokenizer_;
  std::int64_t max_length_;
  std::string max_length_from_;  // where max_length came from, for describe()
};

/// The shared keys: "tokenizer" (required), "max_length" (default: what the tokenizer's folder
/// declares, text/declared_max_length.h, else 128; at most the tokenizer's model_max_length) and
/// "split".
/// "max_length" from the recipe, else what the tokenizer's folder declares
/// (text/declared_max_length.h), else 128; with where it came from, for the run header.
std::pair<std::int64_t, std::string> max_length_option(const ConfigReader& c, const std::string& tokenizer_dir);

struct TextOptions {
  std::string tokenizer;
  std::int64_t max_length = 128;
  std::string max_length_from = "the default";  // "the recipe", or the file that declared it
  SplitOptions split;
  std::optional<std::int64_t> limit;  // the first N records of the part
  static TextOptions from_config(const ConfigReader& c);
  TextOptions for_run(std::uint64_t run_seed) const {
    TextOptions o = *this;
    o.split = split.for_run(run_seed);
    return o;
  }
};

/// Debian's fortunes: "categories" (file names under "dir", default /usr/share/games/fortunes).
std::shared_ptr<Dataset> make_fortunes(const TextOptions& o, const std::string& dir,
                                       const std::vector<std::string>& categories);

/// CSV / JSONL: "file", "text" (column/key, default "text"), "text_pair" (optional), "label"
/// (default "label": integers, or names mapped to their sorted order). Without labels: "label":
/// null, or no column/key "label" when the config names none. A label named in the config must
/// be there.
struct TableOptions {
  std::string file, text = "text", text_pair;
  std::optional<std::string> label = "label";  // nullopt: unlabelled
  bool label_given = false;                    // the config names the label (or null)
  static TableOptions from_config(const ConfigReader& c);
};
std::shared_ptr<Dataset> make_text_csv(const TextOptions& o, const TableOptions& t);
std::shared_ptr<Dataset> make_text_jsonl(const TextOptions& o, const TableOptions& t);

/// Parses RFC 4180 CSV (quoted fields with commas, quotes doubled, newlines inside quotes).
/// Throws refit::Error naming the line of an unterminated quote.
std::vector<std::vector<std::string>> parse_csv(const std::string& content);

}  // namespace refit::text
