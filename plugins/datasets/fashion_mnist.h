#pragma once
// Fashion-MNIST from its four IDX files (gzipped or not): 28x28 grayscale images of 10 kinds of
// clothing, 60000 for training ("train-*") and 10000 for testing ("t10k-*"). Decoded once, at
// construction, into one uint8 tensor; get() returns float32 [1, 28, 28] in [0, 1].
#include <cstdint>
#include <filesystem>
#include <string>

#include "refit/config.h"
#include "source.h"
#include "view.h"

namespace refit::datasets {

/// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* kFashionMnistDebianRoot = "/usr/share/datasets/fashion-mnist";

struct FashionMnistOptions {
  std::filesystem::path root = kFashionMnistDebianRoot;
  std::string set = "train";  // "train" | "test"
  ViewOptions view;
  static FashionMnistOptions from_config(const ConfigReader& c);
};

class FashionMnistDataset : public Source {
 public:
  /// Reads and checks both files; throws refit::Error naming the file and the record.
  explicit FashionMnistDataset(const FashionMnistOptions& options);
  std::int64_t size() const override { return images_.size(0); }
  Example get(std::int64_t index) const override;
  std::int64_t num_classes() const override { return 10; }
  /// The dataset's published label names (index 0: "T-shirt/top", ..., 9: "Ankle boot").
  std::vector<std::string> class_names() const override;
  std::int64_t label(std::int64_t index) const override { return labels_.data_ptr<std::uint8_t>()[index]; }
  std::string name() const override { return "fashion_mnist " + set_; }
  std::vector<std::int64_t> input_shape() const override { return {1, 28, 28}; }
  std::string input_field() const override { return "pixel_values"; }

  /// The image and label files of `set` in `root` (the .gz name when both exist); throws when
  /// neither exists, listing the names tried.
  static std::filesystem::path find_file(const std::filesystem::path& root, const std::string& set, const std::string& kind);

 private:
  std::string set_;
  at::Tensor images_;  // uint8 [N, 1, 28, 28]
  at::Tensor labels_;  // uint8 [N]
};

}  // namespace refit::datasets
