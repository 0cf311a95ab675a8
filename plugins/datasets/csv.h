#pragma once
// CSV files of numeric features and an integer class label per row (plain or gzipped), e.g.
// sklearn's digits.csv.gz: 64 pixel values and the digit. Parsed once, at construction, into
// one float32 tensor [N, F]; get() returns a row, viewed as "shape" when given and divided by
// "scale".
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "refit/config.h"
#include "source.h"
#include "view.h"

namespace refit::datasets {

struct CsvOptions {
  std::filesystem::path path;
  std::optional<std::int64_t> label_column = -1;   // negative: from the end (-1: the last column); null: no labels
  bool header = false;                             // skip the first line
  std::optional<std::vector<std::int64_t>> shape;  // view each row's features as this
  double scale = 1.0;                              // features are divided by it
  char delimiter = ',';
  std::string field = "features";           // the input's field name ("pixel_values": rows of pixels for an image model)
  std::optional<std::int64_t> num_classes;  // default: the largest label + 1
  ViewOptions view;
  static CsvOptions from_config(const ConfigReader& c);
};

class CsvDataset : public Source {
 public:
  /// Reads and checks the whole file; throws refit::Error naming the file and the line.
  explicit CsvDataset(const CsvOptions& options);
  std::int64_t size() const override { return features_.size(0); }
  Example get(std::int64_t index) const override;
  std::int64_t num_classes() const override { return num_classes_; }
  std::int64_t label(std::int64_t index) const override {
    return labels_.empty() ? -1 : labels_[static_cast<std::size_t>(index)];
  }
  bool has_labels() const override { return labelled_; }
  std::string name() const override { return "csv " + file_; }
  std::vector<std::int64_t> input_shape() const override { return shape_; }
  std::string input_field() const override { return field_; }

 private:
  std::string file_;
  at::Tensor features_;               // float32 [N, F], already divided by scale
  std::vector<std::int64_t> labels_;  // empty when unlabelled
  bool labelled_ = true;
  std::string field_;
  std::vector<std::int64_t> shape_;
  std::int64_t num_classes_ = 0;
};

}  // namespace refit::datasets
