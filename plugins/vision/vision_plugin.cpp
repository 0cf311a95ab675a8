// The vision plugin: models for image and feature inputs.
#include "mlp.h"
#include "refit/plugin.h"
#include "vit.h"

namespace {

void register_vision(refit::Registry& r) {
  r.models.add("mlp", "multi-layer perceptron; Linear layers named layers.N",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto o = refit::vision::MlpOptions::from_config(c);
                 return [o](const refit::BuildContext&) { return std::make_shared<refit::vision::Mlp>(o); };
               });
  r.models.add("vit",
               "Vision Transformer, DINOv2 architecture; HF Dinov2Model / Dinov2WithRegistersModel parameter names; "
               "output cls | cls_mean | tokens",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto o = refit::vision::VitOptions::from_config(c);
                 return [o](const refit::BuildContext&) { return std::make_shared<refit::vision::Vit>(o); };
               });
  r.models.add("linear_head", "linear classification head over features [..., in_features]; linear.weight/bias",
               [](const refit::ConfigReader& c) -> refit::Builder<refit::Model> {
                 auto o = refit::vision::LinearHeadOptions::from_config(c);
                 return [o](const refit::BuildContext&) { return std::make_shared<refit::vision::LinearHead>(o); };
               });
}

}  // namespace

REFIT_PLUGIN("vision", "0.1.0", register_vision)
