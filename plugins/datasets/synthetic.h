#pragma once
// A synthetic classification dataset: Gaussian clusters around fixed class centres. The centres
// depend on `seed` only, the samples on `sample_seed`, so train and val splits drawn with
// different sample seeds share one task.
#include <cstdint>

#include "refit/config.h"
#include "refit/dataset.h"
#include "source.h"
#include "view.h"

namespace refit::datasets {

struct SyntheticOptions {
  std::int64_t num_samples = 1024;
  std::int64_t num_features = 16;
  std::int64_t num_classes = 4;
  double noise = 1.0;       // standard deviation around each centre
  double separation = 2.0;  // scale of the class centres
  std::uint64_t seed = 0;
  std::uint64_t sample_seed = 1;
  bool sample_seed_given = false;  // else the run's /training/seed + 1 (datasets_plugin.cpp)
  ViewOptions view;                // classes, split, limit, transforms
  static SyntheticOptions from_config(const ConfigReader& c);
};

class SyntheticDataset : public Source {
 public:
  explicit SyntheticDataset(SyntheticOptions options);
  std::int64_t size() const override { return options_.num_samples; }
  Example get(std::int64_t index) const override;
  std::int64_t num_classes() const override { return options_.num_classes; }
  std::string describe() const override;
  std::int64_t label(std::int64_t index) const override;
  std::string name() const override { return "synthetic"; }
  std::vector<std::int64_t> input_shape() const override { return {options_.num_features}; }
  std::string input_field() const override { return "features"; }

 private:
  SyntheticOptions options_;
  torch::Tensor inputs_, targets_;
};

}  // namespace refit::datasets
