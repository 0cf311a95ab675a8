// The LoRA plugin: adapter "lora".
#include "lora.h"
#include "refit/plugin.h"

namespace {

void register_lora(refit::Registry& r) {
  r.adapters.add("lora", "LoRA factors on adaptable Linear/Conv2d layers; PEFT-compatible files",
                 [](const refit::ConfigReader& c) -> refit::Builder<refit::Adapter> {
                   auto o = refit::lora::LoraOptions::from_config(c);
                   return [o](const refit::BuildContext&) { return std::make_shared<refit::lora::LoraAdapter>(o); };
                 });
}

}  // namespace

REFIT_PLUGIN("lora", "0.1.0", register_lora)
