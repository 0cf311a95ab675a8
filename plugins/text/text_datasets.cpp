#include "text_datasets.h"

#include "text/declared_max_length.h"

#include <tuple>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "refit/error.h"
#include "refit/shuffle.h"
#include "text/read_file.h"

namespace fs = std::filesystem;

namespace refit::text {

namespace {

std::shared_ptr<const WordPieceTokenizer> load_tokenizer(const std::string& dir) {
  try {
    return std::make_shared<const WordPieceTokenizer>(WordPieceTokenizer::from_directory(dir));
  } catch (const std::exception& e) {
    throw Error(std::string("tokenizer: ") + e.what());
  }
}

torch::Tensor ids_tensor(const std::vector<std::int64_t>& v) {
  return torch::tensor(at::ArrayRef<std::int64_t>(v), torch::kLong);
}

/// The part of `records` the options choose, then at most `limit` of them.
std::vector<TextRecord> choose(std::vector<TextRecord> records, const TextOptions& o) {
  std::vector<TextRecord> out;
  for (auto i : split_indices(records.size(), o.split)) out.push_back(std::move(records[i]));
  if (o.limit && static_cast<std::int64_t>(out.size()) > *o.limit) out.resize(static_cast<std::size_t>(*o.limit));
  return out;
}

/// Labels from a column: all integers (used as they are), else names (their sorted order).
std::vector<std::string> assign_labels(std::vector<TextRecord>& records, const std::vector<std::string>& raw,
                                       const std::string& where) {
  // More classes than this is a label column of ids or a mistake, not classification.
  constexpr std::int64_t kMaxClasses = 1 << 20;
  bool integers = true;
  std::int64_t top = -1;
  for (const auto& r : raw) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(r.c_str(), &end, 10);
    if (r.empty() || *end != '\0' || v < 0 || errno == ERANGE) integers = false;
    else
      top = std::max<std::int64_t>(top, v);
  }
  if (integers && top >= kMaxClasses)
    throw Error(where + ": label " + std::to_string(top) + " is not a class index below " + std::to_string(kMaxClasses));
  std::vector<std::string> names;
  if (integers) {
    for (std::int64_t c = 0; c <= top; ++c) names.push_back(std::to_string(c));
    for (std::size_t i = 0; i < raw.size(); ++i) records[i].label = std::stoll(raw[i]);
  } else {
    std::set<std::string> distinct(raw.begin(), raw.end());
    names.assign(distinct.begin(), distinct.end());
    for (std::size_t i = 0; i < raw.size(); ++i)
      records[i].label = std::lower_bound(names.begin(), names.end(), raw[i]) - names.begin();
  }
  if (names.empty()) throw Error(where + ": no records");
  if (static_cast<std::int64_t>(names.size()) > kMaxClasses)
    throw Error(where + ": " + std::to_string(names.size()) + " distinct labels; expected at most " +
                std::to_string(kMaxClasses) + " classes");
  return names;
}

}  // namespace

TextDataset::TextDataset(std::string name, std::vector<TextRecord> records, std::vector<std::string> class_names,
                         std::shared_ptr<const WordPieceTokenizer> tokenizer, std::int64_t max_length,
                         std::string max_length_from)
    : name_(std::move(name)), records_(std::move(records)), class_names_(std::move(class_names)),
      tokenizer_(std::move(tokenizer)), max_length_(max_length), max_length_from_(std::move(max_length_from)) {
  if (records_.empty()) throw Error(name_ + ": no records left after the split");
}

std::vector<FieldInfo> TextDataset::fields() const {
  std::vector<FieldInfo> f{{"input_ids", true, static_cast<double>(tokenizer_->pad_id()), "attention_mask"},
                           {"token_type_ids", true, 0.0, "attention_mask"}};
  if (labelled()) f.push_back({"labels"});
  return f;
}

Example TextDataset::get(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(name_ + ": sample index " + std::to_string(index) + " is out of range [0, " + std::to_string(size()) + ")");
  const TextRecord& r = records_[static_cast<std::size_t>(index)];
  const auto n = static_cast<std::size_t>(max_length_);
  const Encoding e = r.pair.empty() ? tokenizer_->encode(r.text, n) : tokenizer_->encode_pair(r.text, r.pair, n);
  Example out{{"input_ids", ids_tensor(e.input_ids)}, {"token_type_ids", ids_tensor(e.token_type_ids)}};
  if (labelled()) out.set("labels", torch::tensor(r.label, torch::kLong));
  return out;
}

std::string TextDataset::describe() const {
  std::string classes;
  for (const auto& c : class_names_) classes += (classes.empty() ? "" : ",") + c;
  const std::string labels =
      labelled() ? std::to_string(class_names_.size()) + " classes [" + classes + "]" : std::string("no labels");
  return name_ + ": " + std::to_string(size()) + " records, " + labels + ", WordPiece max_length " +
         std::to_string(max_length_) + (max_length_from_.empty() ? "" : " (" + max_length_from_ + ")");
}

std::pair<std::int64_t, std::string> max_length_option(const ConfigReader& c, const std::string& tokenizer_dir) {
  if (c.has("max_length")) return {c.number_in<std::int64_t>("max_length", 128, 3, 1 << 20), "the recipe"};
  std::optional<DeclaredMaxLength> declared;
  try {
    declared = declared_max_length(tokenizer_dir);
  } catch (const std::exception& e) {
    c.error("tokenizer", e.what());
  }
  if (declared) return {declared->tokens, declared->source};
  return {128, "the default"};
}

TextOptions TextOptions::from_config(const ConfigReader& c) {
  TextOptions o;
  o.tokenizer = c.required<std::string>("tokenizer");
  if (c.has("tokenizer") && c.raw()["tokenizer"].is_string()) o.tokenizer = c.resolve(o.tokenizer).string();
  std::tie(o.max_length, o.max_length_from) = max_length_option(c, o.tokenizer);
  o.split = SplitOptions::from_config(c);
  if (c.has("limit")) o.limit = c.number_in<std::int64_t>("limit", 0, 1, std::int64_t{1} << 40);
  return o;
}

TableOptions TableOptions::from_config(const ConfigReader& c) {
  TableOptions t;
  t.file = c.path("file").string();
  t.text = c.optional<std::string>("text", t.text);
  t.text_pair = c.optional<std::string>("text_pair", t.text_pair);
  t.label_given = c.has("label");
  if (t.label_given && c.raw()["label"].is_null()) t.label.reset();
  else
    t.label = c.optional<std::string>("label", *t.label);
  return t;
}

std::shared_ptr<Dataset> make_fortunes(const TextOptions& o, const std::string& dir,
                                       const std::vector<std::string>& categories) {
  std::vector<TextRecord> records;
  for (std::size_t c = 0; c < categories.size(); ++c) {
    const fs::path file = fs::path(dir) / categories[c];
    std::ifstream in(file);
    if (!in) throw Error("fortunes: cannot read " + file.string() + " (Debian's package \"fortunes\" installs the corpus)");
    std::string line, text;
    auto flush = [&] {
      if (text.find_first_not_of(" \t\n") != std::string::npos)
        records.push_back(TextRecord{text, "", static_cast<std::int64_t>(c)});
      text.clear();
    };
    while (std::getline(in, line)) {
      if (line == "%") flush();
      else
        text += (text.empty() ? "" : "\n") + line;
    }
    flush();
  }
  return std::make_shared<TextDataset>("fortunes " + (o.split.enabled ? o.split.part : std::string("all")),
                                       choose(std::move(records), o), categories, load_tokenizer(o.tokenizer), o.max_length,
                                       o.max_length_from);
}

std::vector<std::vector<std::string>> parse_csv(const std::string& s) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  std::size_t line = 1, quote_line = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (quoted) {
      if (ch == '"' && i + 1 < s.size() && s[i + 1] == '"') field += '"', ++i;
      else if (ch == '"')
        quoted = false;
      else
        field += ch, line += ch == '\n';
      continue;
    }
    if (ch == '"' && field.empty()) quoted = true, quote_line = line, any = true;
    else if (ch == ',')
      row.push_back(std::move(field)), field.clear(), any = true;
    else if (ch == '\n' || ch == '\r') {
      if (ch == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      if (any || !field.empty()) row.push_back(std::move(field)), rows.push_back(std::move(row));
      field.clear(), row.clear(), any = false, ++line;
    } else {
      field += ch, any = true;
    }
  }
  if (quoted) throw Error("csv: the quote opened on line " + std::to_string(quote_line) + " is never closed");
  if (any || !field.empty()) row.push_back(std::move(field)), rows.push_back(std::move(row));
  return rows;
}

std::shared_ptr<Dataset> make_text_csv(const TextOptions& o, const TableOptions& t) {
  const auto rows = parse_csv(read_whole_file(t.file, "data"));
  if (rows.size() < 2) throw Error("text_csv " + t.file + ": expected a header and at least one row");
  auto column = [&](const std::string& name) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < rows[0].size(); ++i)
      if (rows[0][i] == name) return i;
    return std::nullopt;
  };
  std::string header;
  for (const auto& h : rows[0]) header += (header.empty() ? "" : ", ") + h;
  auto need = [&](const std::string& name) {
    auto c = column(name);
    if (!c) throw Error("text_csv " + t.file + ": no column \"" + name + "\" (columns: " + header + ")");
    return *c;
  };
  const std::size_t text = need(t.text);
  // Unlabelled: "label": null, or no "label" column when the config names none.
  const bool labelled = t.label && (t.label_given || column(*t.label));
  const std::size_t label = labelled ? need(*t.label) : 0;
  const std::optional<std::size_t> pair = t.text_pair.empty() ? std::nullopt : std::optional<std::size_t>(need(t.text_pair));
  std::vector<TextRecord> records;
  std::vector<std::string> raw;
  for (std::size_t r = 1; r < rows.size(); ++r) {
    const auto& row = rows[r];
    if (row.size() != rows[0].size())
      throw Error("text_csv " + t.file + ": row " + std::to_string(r + 1) + " has " + std::to_string(row.size()) +
                  " fields, the header " + std::to_string(rows[0].size()));
    records.push_back(TextRecord{row[text], pair ? row[*pair] : "", 0});
    if (labelled) raw.push_back(row[label]);
  }
  auto names = labelled ? assign_labels(records, raw, "text_csv " + t.file) : std::vector<std::string>{};
  return std::make_shared<TextDataset>("text_csv " + t.file, choose(std::move(records), o), names,
                                       load_tokenizer(o.tokenizer), o.max_length, o.max_length_from);
}

std::shared_ptr<Dataset> make_text_jsonl(const TextOptions& o, const TableOptions& t) {
  std::istringstream in(read_whole_file(t.file, "data"));
  std::vector<TextRecord> records;
  std::vector<std::string> raw;
  std::string line;
  std::optional<bool> labelled;  // decided by the first record unless the config names the label
  if (!t.label) labelled = false;
  else if (t.label_given)
    labelled = true;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = "text_jsonl " + t.file + ", line " + std::to_string(n);
    if (j.is_discarded() || !j.is_object()) throw Error(where + ": not a JSON object");
    auto str = [&](const std::string& key) {
      if (!j.contains(key)) throw Error(where + ": no key \"" + key + "\"");
      const auto& v = j[key];
      if (v.is_string()) return v.get<std::string>();
      if (v.is_number_integer() && key == t.label) return std::to_string(v.get<long long>());
      throw Error(where + ": \"" + key + "\" must be a string" + (key == t.label ? " or an integer" : ""));
    };
    if (!labelled) labelled = j.contains(*t.label);
    else if (!*labelled && t.label && j.contains(*t.label))
      throw Error(where + ": has a \"" + *t.label + "\" key, which the first record lacks (every record must agree)");
    records.push_back(TextRecord{str(t.text), t.text_pair.empty() ? "" : str(t.text_pair), 0});
    if (*labelled) raw.push_back(str(*t.label));
  }
  auto names = labelled.value_or(false) ? assign_labels(records, raw, "text_jsonl " + t.file) : std::vector<std::string>{};
  return std::make_shared<TextDataset>("text_jsonl " + t.file, choose(std::move(records), o), names,
                                       load_tokenizer(o.tokenizer), o.max_length, o.max_length_from);
}

}  // namespace refit::text
