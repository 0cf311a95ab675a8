#include "transforms.h"

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

bool read_size(const ConfigReader& c, const std::string& key, bool required, std::int64_t& height, std::int64_t& width) {
  std::optional<std::vector<std::int64_t>> v;
  if (required) v = c.required<std::vector<std::int64_t>>(key);
  else v = c.maybe<std::vector<std::int64_t>>(key);
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
      report(t, "", t.type() + " needs image inputs [C, H, W], got " + shape_string(shape) +
                        (shape.size() == 1 ? " (a csv dataset gives images with \"shape\")" : ""));
      return std::nullopt;
    }
    switch (t.kind) {
      case Transform::Kind::normalize: {
        auto n = static_cast<std::int64_t>(t.mean.size());
        if (shape.empty() || (n != 1 && n != shape[0])) {
          report(t, "mean", "has " + std::to_string(n) + " values; expected 1 or one per channel (" +
                                (shape.empty() ? std::string("none") : std::to_string(shape[0])) +
                                ", the first dimension of " + shape_string(shape) + ")");
          ok = false;
        }
        break;
      }
      case Transform::Kind::resize:
        shape = {shape[0], t.height, t.width};
        break;
      case Transform::Kind::random_crop:
        if (t.height > shape[1] + 2 * t.padding || t.width > shape[2] + 2 * t.padding) {
          report(t, "size", "a " + std::to_string(t.height) + "x" + std::to_string(t.width) +
                                " crop does not fit in the " + std::to_string(shape[1]) + "x" + std::to_string(shape[2]) +
                                " input with padding " + std::to_string(t.padding));
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
      case Transform::Kind::resize:
        x = resize_bilinear(x, t.height, t.width, t.antialias);
        break;
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
