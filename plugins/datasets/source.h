#pragma once
// Source: the plugin's internal base for labelled datasets. Besides refit::Dataset it exposes
// what the classes/split/limit/transforms view (view.h) needs without decoding any input: each
// sample's label, a name for logs and the shape of every input.
#include <cstdint>
#include <string>
#include <vector>

#include "refit/dataset.h"

namespace refit::datasets {

class Source : public Dataset {
 public:
  /// The class index of sample `index`, without decoding its input.
  virtual std::int64_t label(std::int64_t index) const = 0;
  /// What the dataset is, for logs: "fashion_mnist train", "csv /data/digits.csv.gz".
  virtual std::string name() const = 0;
  /// The shape of every get(i).input: [1, 28, 28], [64].
  virtual std::vector<std::int64_t> input_shape() const = 0;
  /// "NAME: N samples, K classes, [shape]".
  std::string describe() const override;
};

/// "[1, 28, 28]".
std::string shape_string(const std::vector<std::int64_t>& shape);
/// "[0,1,2]".
std::string list_string(const std::vector<std::int64_t>& values);

}  // namespace refit::datasets
