#include "fashion_mnist.h"

#include <ATen/ATen.h>

#include "idx.h"
#include "refit/error.h"

namespace refit::datasets {

namespace fs = std::filesystem;

FashionMnistOptions FashionMnistOptions::from_config(const ConfigReader& c) {
  FashionMnistOptions o;
  if (auto root = c.optional_path("root")) o.root = *root;
  const bool has_set = c.has("set");
  if (has_set) o.set = c.choice("set", {"train", "test"}, o.set);
  if (c.has("split") && c.raw()["split"].is_string()) {
    if (has_set) c.error("split", "the file set is given twice, by \"set\" and by \"split\"; keep one");
    else
      o.set = c.choice("split", {"train", "test"}, o.set);
  }
  std::error_code ec;
  if (!fs::is_directory(o.root, ec))
    c.error("root",
            "no such folder: " + o.root.string() +
                (c.has("root") ? std::string() : " (the default; install Debian's dataset-fashion-mnist or set \"root\")"));
  o.view = ViewOptions::from_config(c, std::vector<std::int64_t>{1, 28, 28}, 10, /*split_may_be_string=*/true);
  return o;
}

fs::path FashionMnistDataset::find_file(const fs::path& root, const std::string& set, const std::string& kind) {
  const std::string stem =
      (set == "test" ? "t10k" : "train") + std::string("-") + kind + (kind == "images" ? "-idx3-ubyte" : "-idx1-ubyte");
  const fs::path gz = root / (stem + ".gz"), plain = root / stem;
  std::error_code ec;
  if (fs::is_regular_file(gz, ec)) return gz;
  if (fs::is_regular_file(plain, ec)) return plain;
  throw Error("fashion_mnist: no " + set + " " + kind + " in " + root.string() + ": tried " + gz.string() + ", " +
              plain.string());
}

FashionMnistDataset::FashionMnistDataset(const FashionMnistOptions& o) : set_(o.set) {
  const fs::path image_file = find_file(o.root, o.set, "images");
  const fs::path label_file = find_file(o.root, o.set, "labels");
  IdxArray images = read_idx(image_file, 3, "image");
  if (images.dims[1] != 28 || images.dims[2] != 28)
    throw Error(image_file.string() + ": expected 28x28 images, the header says " + std::to_string(images.dims[1]) + "x" +
                std::to_string(images.dims[2]) + " (offset 8)");
  IdxArray labels = read_idx(label_file, 1, "label");
  if (labels.dims[0] != images.dims[0])
    throw Error("fashion_mnist: " + label_file.string() + " has " + std::to_string(labels.dims[0]) + " labels but " +
                image_file.string() + " has " + std::to_string(images.dims[0]) + " images");
  const std::uint8_t* l = labels.data.data_ptr<std::uint8_t>();
  for (std::int64_t i = 0; i < labels.dims[0]; ++i)
    if (l[i] >= 10)
      throw Error(label_file.string() + ": label " + std::to_string(l[i]) + " of record " + std::to_string(i) + " (offset " +
                  std::to_string(labels.header_bytes + static_cast<std::uint64_t>(i)) + ") is not a class index in [0, 9]");
  images_ = images.data.view({images.dims[0], 1, 28, 28});
  labels_ = labels.data;
}

std::vector<std::string> FashionMnistDataset::class_names() const {
  return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
}

Example FashionMnistDataset::get(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(name() + ": sample index " + std::to_string(index) + " is out of range [0, " + std::to_string(size()) + ")");
  return labelled(input_field(), images_[index].to(at::kFloat).div_(255.0f), label(index));
}

}  // namespace refit::datasets
