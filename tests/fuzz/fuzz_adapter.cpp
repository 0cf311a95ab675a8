// libFuzzer target: the adapter-folder reader (io::adapter_files_from_bytes: adapter_model.safetensors
// validated and every tensor read, adapter_config.json checked and parsed), then what a recipe's
// adapter "load" does with the files: LoRA's import_files, which checks the config against the
// recipe's options and each tensor's name and shape against the attached layers before copying.
// Two models stand for two recipes: an adaptable Linear 8 -> 6 "proj" with LoRA r 4, alpha 8
// (tests/golden/lora/linear/peft) and a Conv2d 3 -> 4 "conv" with DoRA r 2, alpha 4, rsLoRA
// (tests/golden/lora/dora/conv/peft).
// Input: adapter_config.json's text, a NUL byte (JSON text holds none), adapter_model.safetensors.
// Clean refusals: refit::Error from the reader, std::runtime_error from the plugin (the SDK's
// Adapter reports that way); anything else that escapes, a crash or an ASan report is a finding.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "../../plugins/lora/lora.h"
#include "../unit/adaptable_nets.h"
#include "io/adapter_files.h"
#include "refit/error.h"
#include "refit/layers.h"
#include "refit/model.h"

#include <ATen/Parallel.h>

namespace {

using namespace refit;

using lora_test::ConvNet;
using lora_test::LinearNet;

struct Target {
  std::shared_ptr<Model> model;
  std::shared_ptr<lora::LoraAdapter> adapter;
};

Target make(std::shared_ptr<Model> model, lora::LoraOptions o) {
  Target t{std::move(model), std::make_shared<lora::LoraAdapter>(std::move(o))};
  t.adapter->attach(*t.model);
  return t;
}

Target* linear_target;
Target* dora_target;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  lora::LoraOptions a;
  a.r = 4, a.alpha = 8, a.target_modules = {"proj"};
  linear_target = new Target(make(std::make_shared<LinearNet>(), a));
  lora::LoraOptions d;
  d.r = 2, d.alpha = 4, d.use_rslora = true, d.use_dora = true, d.target_modules = {"conv"};
  dora_target = new Target(make(std::make_shared<ConvNet>(), d));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* nul = static_cast<const std::uint8_t*>(std::memchr(data, 0, size));
  const std::size_t config_size = nul ? static_cast<std::size_t>(nul - data) : size;
  const std::string config(reinterpret_cast<const char*>(data), config_size);
  const std::size_t weights_size = nul ? size - config_size - 1 : 0;
  auto weights = std::shared_ptr<std::uint8_t>(new std::uint8_t[weights_size ? weights_size : 1],
                                               std::default_delete<std::uint8_t[]>());
  if (weights_size) std::memcpy(weights.get(), nul + 1, weights_size);
  AdapterFiles files;
  try {
    files = io::adapter_files_from_bytes(weights, weights_size, config, "/fuzz/adapter");
  } catch (const Error&) {
    return 0;
  }
  for (Target* t : {linear_target, dora_target}) {
    try {
      t->adapter->import_files(*t->model, files);
    } catch (const std::runtime_error&) {
    }
  }
  return 0;
}
