#include "source.h"

namespace refit::datasets {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string list_string(const std::vector<std::int64_t>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + std::to_string(values[i]);
  return out + "]";
}

std::string Source::describe() const {
  const std::string classes = has_labels() ? std::to_string(num_classes()) + " classes" : std::string("no labels");
  return name() + ": " + std::to_string(size()) + " samples, " + classes + ", " + shape_string(input_shape());
}

}  // namespace refit::datasets
