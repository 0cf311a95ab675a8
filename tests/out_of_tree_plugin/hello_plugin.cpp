#include <torch/nn/modules/linear.h>

#include "refit/plugin.h"

namespace {

class Hello : public refit::TensorModel {
 public:
  explicit Hello(std::int64_t n) : proj(register_module("proj", torch::nn::Linear(n, n))) {}
  torch::Tensor forward(const torch::Tensor& x) override { return proj->forward(x); }
  torch::nn::Linear proj;
};

void register_hello(refit::Registry& r) {
  r.models.add("hello_linear", "one Linear layer, from an out-of-tree plugin",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto n = c.required<std::int64_t>("features");
                 return [n](const refit::BuildContext&) { return std::make_shared<Hello>(n); };
               });
}

}  // namespace

REFIT_PLUGIN("hello", "0.1.0", register_hello)
