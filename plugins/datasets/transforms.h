#pragma once
// Transforms: an ordered list applied to a sample's input in Dataset::get():
//
//   {"type": "normalize", "mean": [...], "std": [...]}     (x - mean) / std per channel
//   {"type": "resize", "size": [H, W], "antialias": true}  bilinear
//   {"type": "random_crop", "size": [H, W], "padding": p}  zero padding, then a random window
//   {"type": "hflip", "p": 0.5}                            mirror left-right with probability p
//
// Random draws come from a generator local to one call, seeded by the caller (the view derives
// the seed from the dataset's "seed" and the sample's index), so results are reproducible and
// apply() is safe to call from several threads at once.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/config.h"

namespace refit::datasets {

struct Transform {
  enum class Kind { normalize, resize, random_crop, hflip };
  Kind kind = Kind::normalize;
  std::string pointer;                  // where the recipe configured it ("/data/train/config/transforms/0")
  std::vector<double> mean, std;        // normalize
  std::int64_t height = 0, width = 0;   // resize, random_crop
  bool antialias = true;                // resize
  std::int64_t padding = 0;             // random_crop
  double p = 0.5;                       // hflip
  at::Tensor mean_t, std_t;             // normalize, shaped to broadcast (set by Transforms::prepare)

  std::string type() const;
  std::string describe() const;         // "random_crop 28x28 pad 4"
};

class Transforms {
 public:
  /// Reads the "transforms" array of `c`. When the input shape is known at parse time, the list
  /// is checked against it here (errors at the transform's JSON pointer).
  static Transforms from_config(const ConfigReader& c, const std::optional<std::vector<std::int64_t>>& input_shape);

  bool empty() const { return items_.empty(); }
  /// True when any transform draws random numbers.
  bool random() const;
  const std::vector<Transform>& items() const { return items_; }

  using Report = std::function<void(const Transform&, const std::string& key, const std::string& message)>;
  /// The output shape for inputs of `shape`, or nullopt after report() for each transform that
  /// does not fit (an image transform on a flat input, a crop larger than the padded image, …).
  std::optional<std::vector<std::int64_t>> output_shape(std::vector<std::int64_t> shape, const Report& report) const;

  /// Checks the list against `input_shape` (throws refit::Error naming the transform) and
  /// precomputes what apply() needs. Call once before apply().
  void prepare(const std::vector<std::int64_t>& input_shape);

  /// Applies the list to one input; random draws come from a generator seeded with `seed`.
  at::Tensor apply(at::Tensor x, std::uint64_t seed) const;

  /// "random_crop 28x28 pad 4, hflip p=0.5".
  std::string describe() const;

 private:
  std::vector<Transform> items_;
};

/// Bilinear resize of a [C, H, W] float tensor to [C, height, width] (align_corners = false;
/// with `antialias`, downscaling averages like PIL / torchvision).
at::Tensor resize_bilinear(const at::Tensor& chw, std::int64_t height, std::int64_t width, bool antialias);

/// A well-mixed 64-bit seed for sample `index` of a dataset seeded with `seed` (SplitMix64).
std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t index);

/// Reads `key` as [height, width] with positive integers (records an error otherwise).
bool read_size(const ConfigReader& c, const std::string& key, bool required, std::int64_t& height, std::int64_t& width);

}  // namespace refit::datasets
