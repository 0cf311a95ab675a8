// The vision plugin: models for image and feature inputs.
#include "mlp.h"
#include "refit/plugin.h"

namespace {

void register_vision(refit::Registry& r) {
  r.models.add("mlp", "multi-layer perceptron; Linear layers named layers.N",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto o = refit::vision::MlpOptions::from_config(c);
                 return [o](const refit::BuildContext&) { return std::make_shared<refit::vision::Mlp>(o); };
               });
}

}  // namespace

REFIT_PLUGIN("vision", "0.1.0", register_vision)
