#include "transforms.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include <ATen/ATen.h>

#include "refit/error.h"
#include "source.h"

namespace refit::datasets {

namespace {

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string numbers(const std::vector<double>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + number(v[i]);
  return out + "]";
}

/// A uniform double in [0, 1) from 53 random bits (the standard distributions' algorithms are
/// implementation-defined; this is not).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

/// A uniform integer in [0, n) (n > 0); modulo bias is below 2^-40 for any image size.
std::int64_t below(std::mt19937_64& rng, std::int64_t n) {
  return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t index) { return splitmix64(splitmix64(seed) ^ index); }

std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t index, std::uint64_t epoch) {
  const std::uint64_t base = sample_seed(seed, index);
  if (epoch == 0) return base;  // get(index) == sample(index, 0)
  return splitmix64(base ^ splitmix64(epoch + 0xA0761D6478BD642FULL));
}

bool read_size(const ConfigReader& c, const std::string& key, bool required, std::int64_t& height, std::int64_t& width) {
  std::optional<std::vector<std::int64_t>> v;
  if (required) v = c.required<std::vector<std::int64_t>>(key);
  else
    v = c.maybe<std::vector<std::int64_t>>(key);
  if (!v || (required && !c.has(key))) return false;
  if (v->size() != 2 || (*v)[0] <= 0 || (*v)[1] <= 0 || (*v)[0] > (1 << 16) || (*v)[1] > (1 << 16)) {
    c.error(key, "expected [height, width] with integers in [1, 65536], got " + Json(*v).dump());
    return false;
  }
  height = (*v)[0];
  width = (*v)[1];
  return true;
}

std::string Transform::type() const {
  switch (kind) {
    case Kind::normalize: return "normalize";
    case Kind::resize: return "resize";
    case Kind::random_crop: return "random_crop";
    case Kind::hflip: return "hflip";
  }
  return "?";
}

std::string Transform::describe() const {
  switch (kind) {
    case Kind::normalize: return "normalize mean " + numbers(mean) + " std " + numbers(std);
    case Kind::resize:
      return "resize " + std::to_string(height) + "x" + std::to_string(width) + (antialias ? "" : " (no antialias)");
    case Kind::random_crop:
      return "random_crop " + std::to_string(height) + "x" + std::to_string(width) +
             (padding ? " pad " + std::to_string(padding) : "");
    case Kind::hflip: return "hflip p=" + number(p);
  }
  return "?";
}

Transforms Transforms::from_config(const ConfigReader& c, const std::optional<std::vector<std::int64_t>>& input_shape) {
  Transforms out;
  bool ok = true;
  std::size_t valid_prefix = 0;  // transforms before the first one with a problem
  for (const ConfigReader& e : c.array("transforms")) {
    Transform t;
    t.pointer = e.pointer();
    std::size_t before = e.issues().size();
    // (on a non-object element, records "expected an object")
    std::string type = e.choice("type", {"normalize", "resize", "random_crop", "hflip"});
    if (e.issues().size() != before) {
      ok = false;
      continue;  // the other keys depend on the type: not checked
    }
    if (type == "normalize") {
      t.kind = Transform::Kind::normalize;
      t.mean = e.required<std::vector<double>>("mean");
      t.std = e.required<std::vector<double>>("std");
      if (e.has("mean") && t.mean.empty()) e.error("mean", "expected at least one value");
      if (e.has("std") && t.std.empty()) e.error("std", "expected at least one value");
      if (!t.mean.empty() && !t.std.empty() && t.mean.size() != t.std.size())
        e.error("std", "has " + std::to_string(t.std.size()) + " values but mean has " + std::to_string(t.mean.size()));
      for (double s : t.std)
        if (!(s > 0)) {
          e.error("std", "expected positive values, got " + numbers(t.std));
          break;
        }
    } else if (type == "resize") {
      t.kind = Transform::Kind::resize;
      read_size(e, "size", true, t.height, t.width);
      t.antialias = e.optional<bool>("antialias", t.antialias);
    } else if (type == "random_crop") {
      t.kind = Transform::Kind::random_crop;
      read_size(e, "size", true, t.height, t.width);
      t.padding = e.number_in<std::int64_t>("padding", 0, 0, 1 << 16);
    } else {
      t.kind = Transform::Kind::hflip;
      t.p = e.number_in<double>("p", 0.5, 0.0, 1.0);
    }
    e.finish();  // unknown keys ("p" on a resize, ...)
    if (e.issues().size() != before) ok = false;
    out.items_.push_back(std::move(t));
    if (ok) valid_prefix = out.items_.size();
  }
  if (input_shape) {
    // Checked up to the first transform with a problem (its output shape is unknown).
    Transforms prefix;
    prefix.items_.assign(out.items_.begin(), out.items_.begin() + static_cast<std::ptrdiff_t>(valid_prefix));
    prefix.output_shape(*input_shape, [&c](const Transform& t, const std::string& key, const std::string& message) {
      c.issues().add(key.empty() ? t.pointer : json_pointer_append(t.pointer, key), message);
    });
  }
  return out;
}

bool Transforms::random() const {
  for (const auto& t : items_)
    if (t.kind == Transform::Kind::random_crop || t.kind == Transform::Kind::hflip) return true;
  return false;
}

std::optional<std::vector<std::int64_t>> Transforms::output_shape(std::vector<std::int64_t> shape,
                                                                  const Report& report) const {
  bool ok = true;
  for (const auto& t : items_) {
    const bool image = shape.size() == 3;
    if (t.kind != Transform::Kind::normalize && !image) {
      report(t, "",
             t.type() + " needs image inputs [C, H, W], got " + shape_string(shape) +
                 (shape.size() == 1 ? " (a csv dataset gives images with \"shape\")" : ""));
      return std::nullopt;
    }
    switch (t.kind) {
      case Transform::Kind::normalize: {
        auto n = static_cast<std::int64_t>(t.mean.size());
        if (shape.empty() || (n != 1 && n != shape[0])) {
          report(t, "mean",
                 "has " + std::to_string(n) + " values; expected 1 or one per channel (" +
                     (shape.empty() ? std::string("none") : std::to_string(shape[0])) + ", the first dimension of " +
                     shape_string(shape) + ")");
          ok = false;
        }
        break;
      }
      case Transform::Kind::resize: shape = {shape[0], t.height, t.width}; break;
      case Transform::Kind::random_crop:
        if (t.height > shape[1] + 2 * t.padding || t.width > shape[2] + 2 * t.padding) {
          report(t, "size",
                 "a " + std::to_string(t.height) + "x" + std::to_string(t.width) + " crop does not fit in the " +
                     std::to_string(shape[1]) + "x" + std::to_string(shape[2]) + " input with padding " +
                     std::to_string(t.padding));
          return std::nullopt;
        }
        shape = {shape[0], t.height, t.width};
        break;
      case Transform::Kind::hflip: break;
    }
  }
  if (!ok) return std::nullopt;
  return shape;
}

void Transforms::prepare(const std::vector<std::int64_t>& input_shape) {
  std::string problems;
  auto out = output_shape(input_shape, [&problems](const Transform& t, const std::string& key, const std::string& m) {
    problems += (problems.empty() ? "" : "; ") + (key.empty() ? t.pointer : json_pointer_append(t.pointer, key)) + ": " + m;
  });
  if (!out) throw Error("transforms: " + problems);
  // Shape each normalize's mean/std to broadcast over the input it will see.
  std::vector<std::int64_t> shape = input_shape;
  for (auto& t : items_) {
    if (t.kind == Transform::Kind::normalize) {
      std::vector<std::int64_t> view(shape.size(), 1);
      view[0] = static_cast<std::int64_t>(t.mean.size());
      auto to_tensor = [&](const std::vector<double>& v) {
        return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(at::kFloat).reshape(view);
      };
      t.mean_t = to_tensor(t.mean);
      t.std_t = to_tensor(t.std);
    } else if (t.kind == Transform::Kind::resize || t.kind == Transform::Kind::random_crop) {
      shape = {shape[0], t.height, t.width};
    }
  }
}

at::Tensor Transforms::apply(at::Tensor x, std::uint64_t seed) const {
  std::mt19937_64 rng(seed);
  for (const auto& t : items_) {
    switch (t.kind) {
      case Transform::Kind::normalize:
        x = (x - t.mean_t) / t.std_t;  // out of place: the input may be the dataset's own storage
        break;
      case Transform::Kind::resize: x = resize_bilinear(x, t.height, t.width, t.antialias); break;
      case Transform::Kind::random_crop: {
        at::Tensor padded = t.padding ? at::constant_pad_nd(x, {t.padding, t.padding, t.padding, t.padding}, 0) : x;
        std::int64_t top = below(rng, padded.size(1) - t.height + 1);
        std::int64_t left = below(rng, padded.size(2) - t.width + 1);
        x = padded.narrow(1, top, t.height).narrow(2, left, t.width).contiguous();
        break;
      }
      case Transform::Kind::hflip:
        if (uniform01(rng) < t.p) x = x.flip({-1});
        break;
    }
  }
  return x;
}

namespace {

/// Reads `key` as [min, max] with 0 < min <= max <= `max` (records an error otherwise).
void read_range(const ConfigReader& c, const std::string& key, double max, double& lo, double& hi) {
  auto v = c.maybe<std::vector<double>>(key);
  if (!v) return;
  const bool ok = v->size() == 2 && std::isfinite((*v)[0]) && std::isfinite((*v)[1]) && (*v)[0] > 0 && (*v)[0] <= (*v)[1] &&
                  (*v)[1] <= max;
  if (!ok) {
    c.error(key, "expected [min, max] with 0 < min <= max" + (std::isinf(max) ? std::string() : " <= " + number(max)) +
                     ", got " + Json(*v).dump());
    return;
  }
  lo = (*v)[0];
  hi = (*v)[1];
}

/// The multi-crop's own stream: the same per-sample seed also seeds the transforms.
constexpr std::uint64_t kMultiCropStream = 0x6D756C746963726FULL;  // "multicro"

std::string size_string(std::int64_t h, std::int64_t w) { return std::to_string(h) + "x" + std::to_string(w); }

}  // namespace

std::optional<MultiCrop> MultiCrop::from_config(const ConfigReader& c,
                                                const std::optional<std::vector<std::int64_t>>& input_shape) {
  if (!c.has("multi_crop")) return std::nullopt;
  if (!c.raw()["multi_crop"].is_object()) {
    c.error("multi_crop",
            "expected an object {\"global_crops\": n, \"global_size\": [H, W], ...}, got " + c.raw()["multi_crop"].dump());
    return std::nullopt;
  }
  MultiCrop m;
  ConfigReader r = c.child("multi_crop");
  m.pointer = r.pointer();
  m.global.count = r.number_in<std::int64_t>("global_crops", m.global.count, 1, 64);
  read_size(r, "global_size", true, m.global.height, m.global.width);
  read_range(r, "global_scale", 1.0, m.global.scale_min, m.global.scale_max);
  m.local.count = r.number_in<std::int64_t>("local_crops", m.local.count, 0, 64);
  read_size(r, "local_size", m.local.count > 0, m.local.height, m.local.width);
  read_range(r, "local_scale", 1.0, m.local.scale_min, m.local.scale_max);
  read_range(r, "ratio", std::numeric_limits<double>::infinity(), m.ratio_min, m.ratio_max);
  m.hflip = r.number_in<double>("hflip", m.hflip, 0.0, 1.0);
  r.finish();  // unknown keys ("global_scales", "size", ...)
  if (input_shape) {
    std::string problem = m.check(*input_shape);
    if (!problem.empty()) c.error("multi_crop", problem);
  }
  return m;
}

std::string MultiCrop::check(const std::vector<std::int64_t>& shape) const {
  if (shape.size() != 3)
    return "multi_crop needs image inputs [C, H, W], got " + shape_string(shape) + " after the transforms" +
           (shape.size() == 1 ? " (a csv dataset gives images with \"shape\")" : "");
  if (shape[1] < 1 || shape[2] < 1) return "multi_crop needs images of at least 1x1, got " + shape_string(shape);
  return "";
}

CropBox random_resized_crop_box(std::mt19937_64& rng, std::int64_t height, std::int64_t width, double scale_min,
                                double scale_max, double ratio_min, double ratio_max) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_min = std::log(ratio_min), log_max = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (scale_min + (scale_max - scale_min) * uniform01(rng));
    const double aspect = std::exp(log_min + (log_max - log_min) * uniform01(rng));
    // Python's round(): half to even, which std::nearbyint does in the default rounding mode.
    const auto w = static_cast<std::int64_t>(std::nearbyint(std::sqrt(target_area * aspect)));
    const auto h = static_cast<std::int64_t>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const std::int64_t top = below(rng, height - h + 1);
      const std::int64_t left = below(rng, width - w + 1);
      return {top, left, h, w};
    }
  }
  // Fallback: the central crop, its ratio clamped to the range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  std::int64_t w = width, h = height;
  if (in_ratio < ratio_min) h = static_cast<std::int64_t>(std::nearbyint(static_cast<double>(w) / ratio_min));
  else if (in_ratio > ratio_max)
    w = static_cast<std::int64_t>(std::nearbyint(static_cast<double>(h) * ratio_max));
  h = std::max<std::int64_t>(1, std::min(h, height));  // only matters for extreme ratios on tiny images
  w = std::max<std::int64_t>(1, std::min(w, width));
  return {(height - h) / 2, (width - w) / 2, h, w};
}

std::vector<at::Tensor> MultiCrop::apply(const at::Tensor& x, std::uint64_t seed) const {
  std::mt19937_64 rng(splitmix64(seed ^ kMultiCropStream));
  std::vector<at::Tensor> views;
  views.reserve(static_cast<std::size_t>(count()));
  for (const CropGroup* g : {&global, &local})
    for (std::int64_t k = 0; k < g->count; ++k) {
      const CropBox b = random_resized_crop_box(rng, x.size(1), x.size(2), g->scale_min, g->scale_max, ratio_min, ratio_max);
      at::Tensor v = resize_bilinear(x.narrow(1, b.top, b.height).narrow(2, b.left, b.width), g->height, g->width, true);
      if (uniform01(rng) < hflip) v = v.flip({-1});
      views.push_back(v.contiguous());
    }
  return views;
}

std::string MultiCrop::describe() const {
  auto group = [](const CropGroup& g, const char* what) {
    return std::to_string(g.count) + " " + what + " " + size_string(g.height, g.width) + " scale " +
           numbers({g.scale_min, g.scale_max});
  };
  return group(global, "global") + (local.count ? " + " + group(local, "local") : std::string()) + ", ratio " +
         numbers({ratio_min, ratio_max}) + ", hflip p=" + number(hflip);
}

std::string Transforms::describe() const {
  std::string out;
  for (const auto& t : items_) out += (out.empty() ? "" : ", ") + t.describe();
  return out;
}

at::Tensor resize_bilinear(const at::Tensor& chw, std::int64_t height, std::int64_t width, bool antialias) {
  if (chw.size(1) == height && chw.size(2) == width) return chw;
  std::vector<std::int64_t> size{height, width};
  at::Tensor in = chw.unsqueeze(0);
  at::Tensor out = antialias ? at::_upsample_bilinear2d_aa(in, at::IntArrayRef(size), false)
                             : at::upsample_bilinear2d(in, at::IntArrayRef(size), false);
  return out.squeeze(0);
}

}  // namespace refit::datasets
