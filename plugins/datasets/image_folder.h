#pragma once
// Image folders: root/<class name>/<image files>, the layout of torchvision's ImageFolder.
// Classes are the sub-folders of root sorted by name (byte order), labelled 0..k-1; images are
// found recursively in each class folder (PNG, JPEG, BMP, GIF, TGA, PNM; other files and names
// starting with "." are skipped) and sorted by path. Construction lists the files and checks
// each one's header; get() decodes one image (stb_image), converts it to "channels" and resizes
// it (bilinear, antialiased) to "size": float32 [C, H, W] in [0, 1].
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "refit/config.h"
#include "source.h"
#include "view.h"

namespace refit::datasets {

struct ImageFolderOptions {
  std::filesystem::path root;
  std::int64_t channels = 3;           // 1: grayscale, 3: RGB (converted as needed)
  std::int64_t height = 0, width = 0;  // every image is resized to this
  ViewOptions view;
  static ImageFolderOptions from_config(const ConfigReader& c);
};

class ImageFolderDataset : public Source {
 public:
  /// Lists and checks the files; throws refit::Error naming the folder or file at fault.
  explicit ImageFolderDataset(const ImageFolderOptions& options);
  std::int64_t size() const override { return static_cast<std::int64_t>(files_.size()); }
  /// Decodes one image; throws refit::Error naming the file when it cannot be decoded.
  Example get(std::int64_t index) const override;
  std::int64_t num_classes() const override { return static_cast<std::int64_t>(class_names_.size()); }
  std::int64_t label(std::int64_t index) const override { return labels_[static_cast<std::size_t>(index)]; }
  std::string name() const override { return "image_folder " + root_; }
  std::vector<std::int64_t> input_shape() const override { return {channels_, height_, width_}; }
  std::string input_field() const override { return "pixel_values"; }

  std::vector<std::string> class_names() const override { return class_names_; }  // the folders' names
  const std::filesystem::path& file(std::int64_t index) const { return files_.at(static_cast<std::size_t>(index)); }

 private:
  std::string root_;
  std::int64_t channels_, height_, width_;
  std::vector<std::string> class_names_;
  std::vector<std::filesystem::path> files_;
  std::vector<std::int64_t> labels_;
};

/// True for the file names image_folder reads (by extension, case-insensitive).
bool is_image_file(const std::filesystem::path& p);

}  // namespace refit::datasets
