#include "csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <string_view>

#include <ATen/ATen.h>

#include "data_file.h"
#include "refit/error.h"

namespace refit::datasets {

CsvOptions CsvOptions::from_config(const ConfigReader& c) {
  CsvOptions o;
  o.path = c.path("path");
  if (c.has("label_column") && c.raw()["label_column"].is_null()) o.label_column.reset();
  else
    o.label_column = c.optional<std::int64_t>("label_column", *o.label_column);
  o.header = c.optional<bool>("header", o.header);
  o.shape = c.maybe<std::vector<std::int64_t>>("shape");
  if (o.shape) {
    bool ok = !o.shape->empty();
    for (std::int64_t d : *o.shape) ok = ok && d > 0;
    if (!ok) c.error("shape", "expected an array of positive integers, got " + Json(*o.shape).dump());
  }
  o.scale = c.optional<double>("scale", o.scale);
  if (!(o.scale > 0) || !std::isfinite(o.scale)) c.error("scale", "expected a positive number, got " + Json(o.scale).dump());
  std::string delimiter = c.optional<std::string>("delimiter", ",");
  if (delimiter.size() != 1 || delimiter[0] == '"' || delimiter[0] == '\n' || delimiter[0] == '\r')
    c.error("delimiter", "expected one character (\",\", \";\", \"\\t\"), got \"" + delimiter + "\"");
  else
    o.delimiter = delimiter[0];
  o.field = c.optional<std::string>("field", o.field);
  if (o.field.empty() || o.field == "labels")
    c.error("field", "expected the input's field name (\"features\", \"pixel_values\"), got \"" + o.field + "\"");
  if (c.has("num_classes")) o.num_classes = c.number_in<std::int64_t>("num_classes", 2, 1, 1 << 30);
  std::error_code ec;
  if (c.has("path") && !o.path.empty() && !std::filesystem::is_regular_file(o.path, ec))
    c.error("path", "no such file: " + o.path.string());
  o.view = ViewOptions::from_config(c, o.shape, o.num_classes.value_or(-1));
  return o;
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool blank(std::string_view line) { return trim(line).empty(); }

/// A field without surrounding spaces and double quotes.
std::string_view field(std::string_view s) {
  s = trim(s);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = trim(s.substr(1, s.size() - 2));
  return s;
}

/// Parses a whole field as a finite number (locale-independent).
bool parse_number(std::string_view s, double& out) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && std::isfinite(out);
}

std::string quoted(std::string_view s) {
  std::string v(s.substr(0, 40));
  return "\"" + v + (s.size() > 40 ? "..." : "") + "\"";
}

}  // namespace

CsvDataset::CsvDataset(const CsvOptions& o) : file_(o.path.string()), field_(o.field) {
  const std::string text = read_data_file(o.path);
  auto where = [&](std::int64_t line) { return file_ + ":" + std::to_string(line) + ": "; };

  std::vector<float> features;
  std::int64_t columns = -1, label_col = -1, rows = 0, max_label = -1;
  std::int64_t line_no = 0;
  std::vector<std::string_view> fields;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line_no == 1 && o.header) continue;
    if (blank(line)) continue;

    fields.clear();
    std::size_t start = 0;
    for (;;) {
      std::size_t d = line.find(o.delimiter, start);
      fields.push_back(field(line.substr(start, d == std::string_view::npos ? std::string_view::npos : d - start)));
      if (d == std::string_view::npos) break;
      start = d + 1;
    }
    const auto n = static_cast<std::int64_t>(fields.size());
    if (columns < 0) {
      columns = n;
      if (!o.label_column) {
        label_col = -1;  // every column a feature
      } else {
        if (columns < 2)
          throw Error(where(line_no) + "expected at least 2 columns (features and a label) separated by '" +
                      std::string(1, o.delimiter) + "', got 1 (\"label_column\": null reads rows without labels)");
        label_col = *o.label_column < 0 ? columns + *o.label_column : *o.label_column;
        if (label_col < 0 || label_col >= columns)
          throw Error(file_ + ": label_column " + std::to_string(*o.label_column) + " is out of range for " +
                      std::to_string(columns) + " columns (line " + std::to_string(line_no) + ")");
      }
    } else if (n != columns) {
      throw Error(where(line_no) + "expected " + std::to_string(columns) + " columns (as on the first data line), got " +
                  std::to_string(n));
    }
    for (std::int64_t k = 0; k < columns; ++k) {
      double v = 0;
      if (!parse_number(fields[static_cast<std::size_t>(k)], v))
        throw Error(where(line_no) + "column " + std::to_string(k + 1) + ": " + quoted(fields[static_cast<std::size_t>(k)]) +
                    " is not a number" + (k == label_col ? " (the label column)" : ""));
      if (k == label_col) {
        if (v < 0 || v != std::floor(v) || v > double(1 << 30))
          throw Error(where(line_no) + "column " + std::to_string(k + 1) + ": label " +
                      quoted(fields[static_cast<std::size_t>(k)]) + " is not a class index (a non-negative integer)");
        auto label = static_cast<std::int64_t>(v);
        if (o.num_classes && label >= *o.num_classes)
          throw Error(where(line_no) + "label " + std::to_string(label) + " is out of range for num_classes " +
                      std::to_string(*o.num_classes));
        max_label = std::max(max_label, label);
        labels_.push_back(label);
      } else {
        features.push_back(static_cast<float>(v / o.scale));
      }
    }
    ++rows;
  }
  if (rows == 0) throw Error(file_ + ": no data rows" + (o.header ? " after the header line" : ""));

  labelled_ = o.label_column.has_value();
  const std::int64_t f = labelled_ ? columns - 1 : columns;
  if (o.shape) {
    std::int64_t count = 1;
    for (std::int64_t d : *o.shape) count *= d;
    if (count != f) {
      std::string s = "[";
      for (std::size_t i = 0; i < o.shape->size(); ++i) s += (i ? ", " : "") + std::to_string((*o.shape)[i]);
      throw Error(file_ + ": shape " + s + "] has " + std::to_string(count) + " elements but the rows have " +
                  std::to_string(f) + " features");
    }
    shape_ = *o.shape;
  } else {
    shape_ = {f};
  }
  num_classes_ = labelled_ ? o.num_classes.value_or(max_label + 1) : -1;
  features_ = at::from_blob(features.data(), {rows, f}, at::TensorOptions().dtype(at::kFloat)).clone();
}

Example CsvDataset::get(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(name() + ": sample index " + std::to_string(index) + " is out of range [0, " + std::to_string(size()) + ")");
  if (!labelled_) return Example{{input_field(), features_[index].reshape(shape_).clone()}};
  return labelled(input_field(), features_[index].reshape(shape_).clone(), label(index));
}

}  // namespace refit::datasets
