#include "synthetic.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace refit::datasets {

SyntheticOptions SyntheticOptions::from_config(const ConfigReader& c) {
  SyntheticOptions o;
  o.num_samples = c.number_in<std::int64_t>("num_samples", o.num_samples, 1, 1LL << 31);
  o.num_features = c.number_in<std::int64_t>("num_features", o.num_features, 1, 1LL << 20);
  o.num_classes = c.number_in<std::int64_t>("num_classes", o.num_classes, 2, 1LL << 20);
  o.noise = c.number_in<double>("noise", o.noise, 0.0, 1e6);
  o.separation = c.number_in<double>("separation", o.separation, 0.0, 1e6);
  o.seed = c.optional<std::uint64_t>("seed", o.seed);
  o.sample_seed_given = c.has("sample_seed");
  o.sample_seed = c.optional<std::uint64_t>("sample_seed", o.sample_seed);
  o.view = ViewOptions::from_config(c, std::vector<std::int64_t>{o.num_features}, o.num_classes);
  return o;
}

SyntheticDataset::SyntheticDataset(SyntheticOptions o) : options_(o) {
  // Own generators: the dataset never touches the global RNG streams of the run.
  auto centre_gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  auto sample_gen = at::make_generator<at::CPUGeneratorImpl>(o.sample_seed);
  auto centres = at::randn({o.num_classes, o.num_features}, centre_gen, at::kFloat) * o.separation;
  targets_ = at::randint(o.num_classes, {o.num_samples}, sample_gen, at::TensorOptions().dtype(at::kLong));
  inputs_ = centres.index_select(0, targets_) + at::randn({o.num_samples, o.num_features}, sample_gen, at::kFloat) * o.noise;
}

Example SyntheticDataset::get(std::int64_t index) const {
  return Example{{input_field(), inputs_[index]}, {"labels", targets_[index]}};
}

std::int64_t SyntheticDataset::label(std::int64_t index) const { return targets_.data_ptr<std::int64_t>()[index]; }

std::string SyntheticDataset::describe() const {
  return "synthetic: " + std::to_string(options_.num_samples) + " samples, " + std::to_string(options_.num_features) +
         " features, " + std::to_string(options_.num_classes) + " classes";
}

}  // namespace refit::datasets
