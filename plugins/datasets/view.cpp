#include "view.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "refit/error.h"
#include "refit/shuffle.h"

namespace refit::datasets {

ViewOptions ViewOptions::from_config(const ConfigReader& c, const std::optional<std::vector<std::int64_t>>& input_shape,
                                     std::int64_t num_classes, bool split_may_be_string) {
  ViewOptions o;
  o.seed_given = c.has("seed");
  o.seed = c.optional<std::uint64_t>("seed", o.seed);

  o.classes_pointer = c.pointer_to("classes");
  o.classes = c.maybe<std::vector<std::int64_t>>("classes");
  if (o.classes) {
    std::set<std::int64_t> seen;
    if (o.classes->empty()) c.error("classes", "expected at least one class index");
    for (std::int64_t k : *o.classes) {
      if (k < 0 || (num_classes > 0 && k >= num_classes)) {
        c.error("classes", "class " + std::to_string(k) + " does not exist" +
                               (num_classes > 0 ? " (the dataset has " + std::to_string(num_classes) + " classes, 0.." +
                                                      std::to_string(num_classes - 1) + ")"
                                                : std::string(" (class indices are >= 0)")));
        break;
      }
      if (!seen.insert(k).second) {
        c.error("classes", "class " + std::to_string(k) + " is listed twice");
        break;
      }
    }
  }

  if (c.has("split") && !(split_may_be_string && c.raw()["split"].is_string())) {
    if (!c.raw()["split"].is_object()) {
      c.error("split", std::string("expected an object {\"fraction\": f, \"part\": \"first\"|\"second\", \"seed\": s}") +
                           (split_may_be_string ? " or one of \"train\", \"test\"" : "") + ", got " +
                           c.raw()["split"].dump());
    } else {
      ConfigReader s = c.child("split");
      if (s.has("fractions")) {
        // Three parts of one seeded permutation: train, val, test.
        auto f = s.required<std::vector<double>>("fractions");
        double total = 0;
        for (double x : f) total += x;
        if (f.size() != 3 || std::any_of(f.begin(), f.end(), [](double x) { return !(x >= 0); }) ||
            std::abs(total - 1.0) > 1e-9)
          s.error("fractions", "expected three non-negative fractions [train, val, test] that add up to 1, got " +
                                   s.raw()["fractions"].dump());
        else
          o.split_fractions = f;
        if (s.has("fraction")) s.error("fraction", "give \"fraction\" (two parts) or \"fractions\" (three), not both");
        o.split_part = s.choice("part", {"train", "val", "test"}, std::string("train"));
      } else {
        double f = s.required<double>("fraction");
        if (s.has("fraction") && !(f > 0 && f < 1))
          s.error("fraction", "expected a number strictly between 0 and 1, got " + Json(f).dump());
        else if (s.has("fraction"))
          o.split_fraction = f;
        o.split_part = s.choice("part", {"first", "second"}, std::string("first"));
      }
      o.split_seed_given = s.has("seed");
      o.split_seed = s.optional<std::uint64_t>("seed", o.seed);
      s.finish();
    }
  }

  if (c.has("limit")) o.limit = c.number_in<std::int64_t>("limit", 1, 1, std::int64_t(1) << 40);
  const std::size_t issues_before = c.issues().size();
  o.transforms = Transforms::from_config(c, input_shape);
  // The multi-crop sees the transforms' output; its shape is known when theirs is and they parsed.
  std::optional<std::vector<std::int64_t>> transformed;
  if (input_shape && c.issues().size() == issues_before)
    transformed = o.transforms.output_shape(*input_shape, [](const Transform&, const std::string&, const std::string&) {});
  o.multi_crop = MultiCrop::from_config(c, transformed);
  return o;
}

ViewOptions ViewOptions::for_run(std::uint64_t run_seed) const {
  ViewOptions o = *this;
  if (!seed_given) o.seed = run_seed;
  if (!split_seed_given) o.split_seed = o.seed;
  return o;
}

View::View(std::shared_ptr<const Source> source, ViewOptions options)
    : source_(std::move(source)), options_(std::move(options)) {
  const std::string name = source_->name();
  const std::int64_t n = source_->size();
  const std::int64_t source_classes = source_->num_classes();

  // Classes: keep and remap.
  if (options_.classes && !source_->has_labels())
    throw Error(name + ": " + options_.classes_pointer + ": the samples have no labels to choose classes by");
  if (options_.classes) {
    std::int64_t table_size = source_classes;
    for (std::int64_t k : *options_.classes) {
      if (k < 0 || (source_classes >= 0 && k >= source_classes))
        throw Error(name + ": " + options_.classes_pointer + ": class " + std::to_string(k) +
                    " does not exist (the dataset has " + std::to_string(source_classes) +
                    (source_classes == 1 ? " class, 0.." : " classes, 0..") + std::to_string(source_classes - 1) + ")");
      table_size = std::max(table_size, k + 1);
    }
    remap_.assign(static_cast<std::size_t>(table_size), -1);
    for (std::size_t i = 0; i < options_.classes->size(); ++i)
      remap_[static_cast<std::size_t>((*options_.classes)[i])] = static_cast<std::int64_t>(i);
    num_classes_ = static_cast<std::int64_t>(options_.classes->size());
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t l = source_->label(i);
      if (l >= 0 && l < table_size && remap_[static_cast<std::size_t>(l)] >= 0) indices_.push_back(i);
    }
  } else {
    num_classes_ = source_classes;
    indices_.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) indices_[static_cast<std::size_t>(i)] = i;
  }

  // Split: a seeded permutation (refit/shuffle.h), the first round(f * n) samples form part "first".
  // Three-way: cut at round(f_train * n) and round((f_train + f_val) * n).
  if (options_.split_fraction || options_.split_fractions) {
    std::mt19937_64 rng(options_.split_seed * 0x9E3779B97F4A7C15ULL + 0x5851F42D4C957F2DULL);
    seeded_shuffle(indices_, rng);
    const double n_all = static_cast<double>(indices_.size());
    auto cut = [&](double f) { return std::min(indices_.size(), static_cast<std::size_t>(std::llround(f * n_all))); };
    std::size_t begin = 0, end = indices_.size();
    if (options_.split_fraction) {
      const std::size_t first = cut(*options_.split_fraction);
      (options_.split_part == "first" ? end : begin) = first;
    } else {
      const auto& f = *options_.split_fractions;
      const std::size_t train_end = cut(f[0]), val_end = std::max(train_end, cut(f[0] + f[1]));
      if (options_.split_part == "train") end = train_end;
      if (options_.split_part == "val") begin = train_end, end = val_end;
      if (options_.split_part == "test") begin = val_end;
    }
    indices_ = std::vector<std::int64_t>(indices_.begin() + static_cast<std::ptrdiff_t>(begin),
                                         indices_.begin() + static_cast<std::ptrdiff_t>(end));
  }

  if (options_.limit && static_cast<std::int64_t>(indices_.size()) > *options_.limit)
    indices_.resize(static_cast<std::size_t>(*options_.limit));

  if (indices_.empty()) throw Error(name + ": no samples left after classes/split/limit");

  try {
    options_.transforms.prepare(source_->input_shape());
  } catch (const Error& e) {
    throw Error(name + ": " + e.what());
  }
  shape_ = *options_.transforms.output_shape(source_->input_shape(),
                                             [](const Transform&, const std::string&, const std::string&) {});
  if (options_.multi_crop) {
    std::string problem = options_.multi_crop->check(shape_);
    if (!problem.empty()) throw Error(name + ": " + options_.multi_crop->pointer + ": " + problem);
  }
}

Example View::get(std::int64_t index) const { return sample(index, 0); }

Example View::sample(std::int64_t index, std::int64_t epoch) const {
  if (index < 0 || index >= size())
    throw Error(source_->name() + ": sample index " + std::to_string(index) + " is out of range [0, " +
                std::to_string(size()) + ")");
  if (epoch < 0) throw Error(source_->name() + ": epoch " + std::to_string(epoch) + " is negative");
  const std::int64_t i = indices_[static_cast<std::size_t>(index)];
  Example e = source_->get(i);
  if (!remap_.empty()) e.set("labels", at::scalar_tensor(remap_[static_cast<std::size_t>(source_->label(i))], at::kLong));
  const std::uint64_t seed = sample_seed(options_.seed, static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(epoch));
  const std::string input = source_->input_field();
  if (!options_.transforms.empty()) e.set(input, options_.transforms.apply(e.at(input), seed));
  if (options_.multi_crop) {
    auto crops = options_.multi_crop->apply(e.at(input), seed);
    const auto globals = static_cast<std::size_t>(options_.multi_crop->global.count);
    for (std::size_t c = 0; c < crops.size(); ++c)
      e.set(c < globals ? "global_crop." + std::to_string(c) : "local_crop." + std::to_string(c - globals), crops[c]);
  }
  return e;
}

std::vector<FieldInfo> View::fields() const {
  std::vector<FieldInfo> out = source_->fields();
  if (options_.multi_crop) {
    for (std::int64_t c = 0; c < options_.multi_crop->global.count; ++c) out.push_back({"global_crop." + std::to_string(c)});
    for (std::int64_t c = 0; c < options_.multi_crop->local.count; ++c) out.push_back({"local_crop." + std::to_string(c)});
  }
  return out;
}

std::vector<std::string> View::class_names() const {
  const std::vector<std::string> names = source_->class_names();
  if (remap_.empty() || names.empty()) return names;
  std::vector<std::string> kept(static_cast<std::size_t>(num_classes_));
  for (std::size_t source_label = 0; source_label < remap_.size() && source_label < names.size(); ++source_label)
    if (remap_[source_label] >= 0) kept[static_cast<std::size_t>(remap_[source_label])] = names[source_label];
  return kept;
}

std::string View::describe() const {
  std::string out = source_->name() + ": " + std::to_string(size()) + " samples, ";
  if (options_.classes) out += "classes " + list_string(*options_.classes) + " -> ";
  out += std::to_string(num_classes_) + " classes, " + shape_string(shape_);
  if (options_.split_fraction) {
    std::ostringstream f;
    f << *options_.split_fraction;
    out +=
        ", split " + options_.split_part + " of fraction " + f.str() + " (seed " + std::to_string(options_.split_seed) + ")";
  }
  if (options_.split_fractions) {
    std::ostringstream f;
    f << (*options_.split_fractions)[0] << "/" << (*options_.split_fractions)[1] << "/" << (*options_.split_fractions)[2];
    out += ", split " + options_.split_part + " of " + f.str() + " (seed " + std::to_string(options_.split_seed) + ")";
  }
  if (options_.limit) out += ", limit " + std::to_string(*options_.limit);
  if (!options_.transforms.empty()) out += ", transforms: " + options_.transforms.describe();
  if (options_.multi_crop) out += ", multi_crop: " + options_.multi_crop->describe();
  if (options_.transforms.random() || options_.multi_crop) out += " (seed " + std::to_string(options_.seed) + ")";
  return out;
}

std::shared_ptr<Dataset> make_dataset(std::shared_ptr<const Source> source, const ViewOptions& options) {
  if (options.trivial()) return std::const_pointer_cast<Source>(source);
  return std::make_shared<View>(std::move(source), options);
}

}  // namespace refit::datasets
