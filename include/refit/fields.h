#pragma once
// Named tensors: what flows through refit's data path. A sample, a batch, a model's inputs and a
// model's outputs are each a set of named tensors ("pixel_values", "input_ids",
// "attention_mask", "labels", "global_crop.0", ...), so that a text encoder with three inputs, a
// model with two outputs and an objective that reads more than a class index all fit the same
// loop. Names are looked up, never positional: a missing name is an error that lists the names
// that are there.
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "refit/error.h"

namespace refit {

class Fields {
 public:
  Fields() = default;
  Fields(std::initializer_list<std::pair<const std::string, torch::Tensor>> init) : tensors_(init) {}

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  /// The tensor named `name`; throws an Error naming the fields that are present when it is not.
  const torch::Tensor& at(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw Error("no field \"" + name + "\" (present: " + list() + ")");
    return it->second;
  }
  /// The tensor named `name`, or an undefined tensor.
  torch::Tensor get(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? torch::Tensor() : it->second;
  }
  void set(const std::string& name, torch::Tensor tensor) { tensors_[name] = std::move(tensor); }
  void erase(const std::string& name) { tensors_.erase(name); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& kv : tensors_) out.push_back(kv.first);
    return out;
  }
  /// "a, b, c" (or "none").
  std::string list() const {
    std::string out;
    for (const auto& kv : tensors_) out += (out.empty() ? "" : ", ") + kv.first;
    return out.empty() ? "none" : out;
  }
  bool empty() const { return tensors_.empty(); }
  std::size_t count() const { return tensors_.size(); }
  auto begin() const { return tensors_.begin(); }
  auto end() const { return tensors_.end(); }
  auto begin() { return tensors_.begin(); }
  auto end() { return tensors_.end(); }

 private:
  std::map<std::string, torch::Tensor> tensors_;
};

/// One sample: named tensors without a batch dimension.
using Example = Fields;

/// A batch: named tensors whose first dimension is the sample (B); `size` is B.
struct Batch : Fields {
  using Fields::Fields;
  std::int64_t samples = 0;
  std::int64_t size() const { return samples; }
};

/// What a dataset says about one field it produces. Fields whose samples differ in shape must be
/// declared `padded`: collation pads dimension 0 (the sequence) of each sample to the longest in
/// the batch with `pad_value`, and writes the mask field `mask` ([B, longest], int64, 1 for a
/// real position, 0 for padding; several padded fields may share one mask).
struct FieldInfo {
  std::string name;
  bool padded = false;
  double pad_value = 0;
  std::string mask;  // padded fields: the mask field collation produces ("attention_mask"); "" = none
};

/// The names in `names` that `present` lacks, in order (for error messages).
inline std::vector<std::string> missing_fields(const std::vector<std::string>& names,
                                               const std::vector<std::string>& present) {
  std::vector<std::string> out;
  for (const auto& n : names) {
    bool found = false;
    for (const auto& p : present) found = found || p == n;
    if (!found) out.push_back(n);
  }
  return out;
}

/// The tensors "<prefix>.0", "<prefix>.1", ... of `fields`, in order, up to the first missing
/// number (multi-crop views: "global_crop.0", "local_crop.3").
inline std::vector<torch::Tensor> numbered_fields(const Fields& fields, const std::string& prefix) {
  std::vector<torch::Tensor> out;
  for (std::size_t i = 0;; ++i) {
    torch::Tensor t = fields.get(prefix + "." + std::to_string(i));
    if (!t.defined()) return out;
    out.push_back(std::move(t));
  }
}

}  // namespace refit
