#pragma once
// Source: the plugin's internal base for labelled datasets. Every sample has two fields: the
// input (input_field(): "pixel_values" for images, "features" for feature vectors) and
// "labels" (a 0-d int64 class index). Besides refit::Dataset it exposes what the
// classes/split/limit/transforms view (view.h) needs without decoding any input: each sample's
// label, a name for logs and the shape of every input.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "refit/dataset.h"

namespace refit::datasets {

class Source : public Dataset {
 public:
  /// The class index of sample `index`, without decoding its input (-1 without labels).
  virtual std::int64_t label(std::int64_t index) const = 0;
  /// False for inputs without classes (a CSV to predict on): no "labels" field.
  virtual bool has_labels() const { return true; }
  /// What the dataset is, for logs: "fashion_mnist train", "csv /data/digits.csv.gz".
  virtual std::string name() const = 0;
  /// The shape of every sample's input field: [1, 28, 28], [64].
  virtual std::vector<std::int64_t> input_shape() const = 0;
  /// The name of the input field.
  virtual std::string input_field() const = 0;
  std::vector<FieldInfo> fields() const override {
    if (!has_labels()) return {{input_field()}};
    return {{input_field()}, {"labels"}};
  }
  /// "NAME: N samples, K classes, [shape]".
  std::string describe() const override;
};

/// A sample of a Source.
inline Example labelled(const std::string& input_field, at::Tensor input, std::int64_t label) {
  return Example{{input_field, std::move(input)}, {"labels", at::scalar_tensor(label, at::kLong)}};
}

/// "[1, 28, 28]".
std::string shape_string(const std::vector<std::int64_t>& shape);
/// "[0,1,2]".
std::string list_string(const std::vector<std::int64_t>& values);

}  // namespace refit::datasets
