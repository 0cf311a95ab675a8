#pragma once
// Test datasets' shared shape: samples with a "features" input and "labels" class indices (the
// fields the built-in image-free recipes use; TensorModel reads "features" by default).
#include <utility>
#include <vector>

#include <torch/types.h>

#include "refit/dataset.h"
#include "refit/model.h"

namespace refit::test {

/// {"features": x, "labels": y}.
inline Example labelled(torch::Tensor x, torch::Tensor y) {
  return Example{{"features", std::move(x)}, {"labels", std::move(y)}};
}

/// A batch of {"features": x, "labels": y} (x [B, ...]).
inline Batch labelled_batch(torch::Tensor x, torch::Tensor y) {
  Batch b{{"features", x}, {"labels", std::move(y)}};
  b.samples = x.dim() > 0 ? x.size(0) : 0;
  return b;
}

/// The input of a sample or batch of the built-in datasets: "pixel_values" (images) or
/// "features" (feature vectors).
inline torch::Tensor input_of(const Fields& f) { return f.has("pixel_values") ? f.at("pixel_values") : f.at("features"); }
/// The class indices ("labels").
inline torch::Tensor label_of(const Fields& f) { return f.at("labels"); }
/// The multi-crop views, global crops first.
inline std::vector<torch::Tensor> views_of(const Fields& f) {
  auto v = numbered_fields(f, "global_crop");
  for (auto& t : numbered_fields(f, "local_crop")) v.push_back(std::move(t));
  return v;
}

/// A model built by a factory as the TensorModel it is (one tensor in, one out).
inline std::shared_ptr<TensorModel> tensor_model(const std::shared_ptr<Model>& m) {
  auto t = std::dynamic_pointer_cast<TensorModel>(m);
  if (!t) throw Error("test: the model is not a TensorModel");
  return t;
}

/// A Dataset whose samples carry "features" and "labels".
class LabelledDataset : public Dataset {
 public:
  std::vector<FieldInfo> fields() const override { return {{"features"}, {"labels"}}; }
};

}  // namespace refit::test
