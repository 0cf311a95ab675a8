#include "image_folder.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <memory>

#include <ATen/ATen.h>
#include <stb_image.h>

#include "refit/error.h"
#include "transforms.h"

namespace refit::datasets {

namespace fs = std::filesystem;

ImageFolderOptions ImageFolderOptions::from_config(const ConfigReader& c) {
  ImageFolderOptions o;
  o.root = c.path("root");
  std::error_code ec;
  if (c.has("root") && !o.root.empty() && !fs::is_directory(o.root, ec))
    c.error("root", "no such folder: " + o.root.string());
  o.channels = c.number_in<std::int64_t>("channels", o.channels, 1, 3);
  if (o.channels == 2) {
    c.error("channels", "expected 1 (grayscale) or 3 (RGB), got 2");
    o.channels = 3;
  }
  read_size(c, "size", true, o.height, o.width);
  std::optional<std::vector<std::int64_t>> shape;
  if (o.height > 0) shape = std::vector<std::int64_t>{o.channels, o.height, o.width};
  o.view = ViewOptions::from_config(c, shape);
  return o;
}

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  static const char* const known[] = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tga", ".pgm", ".ppm", ".pnm"};
  return std::find(std::begin(known), std::end(known), ext) != std::end(known);
}

namespace {

bool hidden(const fs::path& p) { return !p.filename().empty() && p.filename().string()[0] == '.'; }

std::string stb_reason() {
  const char* r = stbi_failure_reason();
  return r ? r : "unknown error";
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(const ImageFolderOptions& o)
    : root_(o.root.string()), channels_(o.channels), height_(o.height), width_(o.width) {
  std::error_code ec;
  if (!fs::is_directory(o.root, ec)) throw Error("image_folder: no such folder: " + root_);

  std::vector<fs::path> class_dirs;
  for (const auto& e : fs::directory_iterator(o.root))
    if (e.is_directory() && !hidden(e.path())) class_dirs.push_back(e.path());
  std::sort(class_dirs.begin(), class_dirs.end());
  if (class_dirs.empty()) throw Error("image_folder: " + root_ + " has no class folders (expected root/<class>/<images>)");

  for (const auto& dir : class_dirs) {
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink);
         it != fs::recursive_directory_iterator(); ++it) {
      if (hidden(it->path())) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file() && is_image_file(it->path())) files.push_back(it->path());
    }
    if (files.empty())
      throw Error("image_folder: class folder " + dir.string() +
                  " has no image files (.png, .jpg, .jpeg, .bmp, .gif, .tga, .pnm)");
    std::sort(files.begin(), files.end());
    const auto label = static_cast<std::int64_t>(class_names_.size());
    class_names_.push_back(dir.filename().string());
    for (auto& f : files) {
      int w = 0, h = 0, n = 0;
      if (!stbi_info(f.c_str(), &w, &h, &n))
        throw Error("image_folder: " + f.string() + ": not a readable image (stb_image: " + stb_reason() + ")");
      files_.push_back(std::move(f));
      labels_.push_back(label);
    }
  }
}

Example ImageFolderDataset::get(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw Error(name() + ": sample index " + std::to_string(index) + " is out of range [0, " + std::to_string(size()) + ")");
  const fs::path& path = files_[static_cast<std::size_t>(index)];
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("image_folder: " + path.string() + ": cannot open the file");
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw Error("image_folder: " + path.string() + ": cannot read the file");
  int w = 0, h = 0, n = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()),
                                                                         static_cast<int>(bytes.size()), &w, &h, &n,
                                                                         static_cast<int>(channels_)),
                                                   stbi_image_free);
  if (!pixels) throw Error("image_folder: " + path.string() + ": cannot decode the image (stb_image: " + stb_reason() + ")");
  at::Tensor hwc = at::from_blob(pixels.get(), {h, w, channels_}, at::TensorOptions().dtype(at::kByte));
  at::Tensor chw = at::empty({channels_, h, w}, at::TensorOptions().dtype(at::kFloat));
  chw.copy_(hwc.permute({2, 0, 1}));
  chw = resize_bilinear(chw, height_, width_, /*antialias=*/true).div_(255.0f).clamp_(0.0f, 1.0f);
  return labelled(input_field(), chw, labels_[static_cast<std::size_t>(index)]);
}

}  // namespace refit::datasets
