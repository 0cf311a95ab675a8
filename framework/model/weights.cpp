#include "model/weights.h"

#include <torch/nn/module.h>

#include "io/safetensors.h"
#include "refit/error.h"

namespace refit {

std::map<std::string, torch::Tensor> model_state(const Model& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model.named_parameters(true)) out[p.key()] = p.value();
  for (const auto& b : model.named_buffers(true)) out[b.key()] = b.value();
  return out;
}

namespace {
std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string o = "[";
  for (std::size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

void list(std::string& msg, const std::string& title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  msg += "\n  " + title + " (" + std::to_string(items.size()) + "):";
  for (std::size_t i = 0; i < items.size() && i < 12; ++i) msg += "\n    " + items[i];
  if (items.size() > 12) msg += "\n    ... and " + std::to_string(items.size() - 12) + " more";
}
}  // namespace

void load_weights(Model& model, const std::filesystem::path& file, const std::string& model_name) {
  if (!std::filesystem::exists(file))
    throw Error("model \"" + model_name + "\": weights file " + file.string() + " does not exist");
  io::SafetensorsFile f = io::SafetensorsFile::open(file);
  auto state = model_state(model);
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& kv : state) {
    if (!f.contains(kv.first)) {
      missing.push_back(kv.first + " " + shape_str(kv.second.sizes().vec()));
      continue;
    }
    const auto& info = f.info(kv.first);
    if (info.shape != kv.second.sizes().vec())
      mismatched.push_back(kv.first + ": file " + shape_str(info.shape) + ", model " + shape_str(kv.second.sizes().vec()));
  }
  for (const auto& t : f.tensors())
    if (!state.count(t.name)) unexpected.push_back(t.name + " " + shape_str(t.shape));
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string msg = "model \"" + model_name + "\": weights file " + file.string() + " does not match the model";
    list(msg, "missing from the file", missing);
    list(msg, "unexpected in the file", unexpected);
    list(msg, "shape mismatches", mismatched);
    throw Error(msg);
  }
  torch::NoGradGuard no_grad;
  for (auto& kv : state) kv.second.copy_(f.load(kv.first));
}

}  // namespace refit
