#pragma once
// Transforms: an ordered list applied to a sample's input in Dataset::get():
//
//   {"type": "normalize", "mean": [...], "std": [...]}     (x - mean) / std per channel
//   {"type": "resize", "size": [H, W], "antialias": true}  bilinear
//   {"type": "random_crop", "size": [H, W], "padding": p}  zero padding, then a random window
//   {"type": "hflip", "p": 0.5}                            mirror left-right with probability p
//
// and, after them, the optional multi-crop augmentation (MultiCrop below, key "multi_crop").
//
// Random draws come from a generator local to one call, seeded by the caller (the view derives
// the seed from the dataset's "seed", the sample's index and the epoch), so results are
// reproducible and apply() is safe to call from several threads at once.
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <torch/types.h>

#include "refit/config.h"

namespace refit::datasets {

struct Transform {
  enum class Kind { normalize, resize, random_crop, hflip };
  Kind kind = Kind::normalize;
  std::string pointer;                 // where the recipe configured it ("/data/train/config/transforms/0")
  std::vector<double> mean, std;       // normalize
  std::int64_t height = 0, width = 0;  // resize, random_crop
  bool antialias = true;               // resize
  std::int64_t padding = 0;            // random_crop
  double p = 0.5;                      // hflip
  at::Tensor mean_t, std_t;            // normalize, shaped to broadcast (set by Transforms::prepare)

  std::string type() const;
  std::string describe() const;  // "random_crop 28x28 pad 4"
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

/// One group of crops of a MultiCrop: `count` crops of `height` x `width`, each covering a
/// fraction of the image's area drawn uniformly in [scale_min, scale_max].
struct CropGroup {
  std::int64_t count = 0;
  std::int64_t height = 0, width = 0;
  double scale_min = 0, scale_max = 1;
};

/// "multi_crop" (DINO-style): after the transforms, `global.count` + `local.count` random resized
/// crops of the transformed image, each like torchvision's RandomResizedCrop (bilinear,
/// antialiased) followed by a horizontal flip with probability `hflip`:
///
///   {"global_crops": 2, "global_size": [H, W], "global_scale": [0.4, 1.0],
///    "local_crops": 0, "local_size": [h, w], "local_scale": [0.05, 0.4],
///    "ratio": [0.75, 1.3333333], "hflip": 0.5}
struct MultiCrop {
  std::string pointer;  // where the recipe configured it ("/data/train/config/multi_crop")
  CropGroup global{2, 0, 0, 0.4, 1.0};
  CropGroup local{0, 0, 0, 0.05, 0.4};
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height, drawn log-uniformly
  double hflip = 0.5;

  /// Reads the "multi_crop" object of `c` (nullopt when absent or not an object). `input_shape`
  /// is the shape after the transforms when known at parse time: it must be an image [C, H, W].
  static std::optional<MultiCrop> from_config(const ConfigReader& c,
                                              const std::optional<std::vector<std::int64_t>>& input_shape);

  std::int64_t count() const { return global.count + local.count; }
  /// Problems with inputs of `shape` ("" when it fits: an image [C, H, W] with H, W >= 1).
  std::string check(const std::vector<std::int64_t>& shape) const;
  /// The crops of one [C, H, W] input, global first; draws from a generator derived from `seed`
  /// (a stream of its own: the transforms' draws for the same seed are not affected).
  std::vector<at::Tensor> apply(const at::Tensor& x, std::uint64_t seed) const;
  /// "2 global 224x224 scale [0.4,1] + 6 local 96x96 scale [0.05,0.4], ratio [0.75,1.33333], hflip p=0.5".
  std::string describe() const;
};

/// A crop window: rows [top, top + height), columns [left, left + width).
struct CropBox {
  std::int64_t top = 0, left = 0, height = 0, width = 0;
};

/// torchvision.transforms.RandomResizedCrop.get_params for a `height` x `width` image: up to 10
/// attempts drawing an area fraction uniformly in [scale_min, scale_max] and an aspect ratio
/// (width / height) log-uniformly in [ratio_min, ratio_max], sides rounded half to even, the
/// first that fits placed uniformly; else the central crop with the ratio clamped to the range.
CropBox random_resized_crop_box(std::mt19937_64& rng, std::int64_t height, std::int64_t width, double scale_min,
                                double scale_max, double ratio_min, double ratio_max);

/// A well-mixed 64-bit seed for sample `index` of a dataset seeded with `seed` (SplitMix64).
std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t index);
/// The seed of sample `index` in epoch `epoch`: sample_seed(seed, index) for epoch 0, another
/// well-mixed seed for every other epoch (a function of the three values only).
std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t index, std::uint64_t epoch);

/// Reads `key` as [height, width] with positive integers (records an error otherwise).
bool read_size(const ConfigReader& c, const std::string& key, bool required, std::int64_t& height, std::int64_t& width);

}  // namespace refit::datasets
