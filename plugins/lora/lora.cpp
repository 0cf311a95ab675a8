#include "lora.h"

#include "fused_delta.h"
#include "refit/layer_targets.h"
#include "refit/module_names.h"

#include <cmath>
#include <set>

namespace refit::lora {

double LoraOptions::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

LoraOptions LoraOptions::from_config(const ConfigReader& c) {
  LoraOptions o;
  o.name = c.optional<std::string>("name", o.name);
  o.r = c.number_in<std::int64_t>("r", o.r, 1, 1 << 16);
  o.alpha = c.number_in<double>("alpha", static_cast<double>(o.r), 0.0, 1e6);
  o.use_rslora = c.optional<bool>("use_rslora", false);
  o.fused = c.optional<bool>("fused", true);
  o.dropout = c.number_in<double>("dropout", 0.0, 0.0, 1.0);
  const LayerTargets targets = LayerTargets::from_config(c);  // the SDK's, shared by every adapter
  o.target_regex = targets.target_regex;
  o.target_modules = targets.target_modules;
  o.layer_types = targets.layer_types;
  o.init = c.choice("init", {"kaiming", "gaussian"}, o.init);
  if (o.name.empty() || o.name.find_first_of("./") != std::string::npos)
    c.error("name", "expected a non-empty name without '.' or '/'");
  return o;
}

LoraDelta::LoraDelta(const nn::AdaptableLayer& layer, const LoraOptions& o)
    : scaling_(o.scaling()), dropout_(o.dropout), fused_(o.fused) {
  const auto& w = layer.weight;
  torch::NoGradGuard no_grad;
  if (auto* conv = dynamic_cast<const nn::Conv2d*>(&layer)) {
    conv_ = true;
    // As PEFT: lora_A takes the layer's kernel, stride and padding, not its dilation.
    stride_ = conv->options.stride;
    padding_ = conv->options.padding;
    lora_A = register_parameter("lora_A", torch::empty({o.r, w.size(1), w.size(2), w.size(3)}, torch::kFloat));
    lora_B = register_parameter("lora_B", torch::zeros({w.size(0), o.r, 1, 1}, torch::kFloat));
  } else {
    lora_A = register_parameter("lora_A", torch::empty({o.r, w.size(1)}, torch::kFloat));
    lora_B = register_parameter("lora_B", torch::zeros({w.size(0), o.r}, torch::kFloat));
  }
  if (o.init == "gaussian") lora_A.normal_(0.0, 1.0 / static_cast<double>(o.r));
  else torch::nn::init::kaiming_uniform_(lora_A, std::sqrt(5.0));
}

torch::Tensor LoraDelta::delta(const torch::Tensor& input) {
  const bool dropping = dropout_ > 0 && is_training();
  if (fused_ && !conv_ && !dropping) return fused_linear_delta(input, lora_A, lora_B, scaling_);
  torch::Tensor h = dropping ? torch::dropout(input, dropout_, true) : input;
  if (!at::autocast::is_autocast_enabled(input.device().type()) && h.scalar_type() != lora_A.scalar_type())
    h = h.to(lora_A.scalar_type());
  torch::Tensor out = conv_ ? at::conv2d(at::conv2d(h, lora_A, {}, stride_, padding_), lora_B)
                            : at::linear(at::linear(h, lora_A), lora_B);
  return out * scaling_;
}

torch::Tensor LoraDelta::delta_weight() const {
  auto a = lora_A.detach().to(torch::kFloat), b = lora_B.detach().to(torch::kFloat);
  if (!conv_) return at::matmul(b, a) * scaling_;
  if (a.size(2) == 1 && a.size(3) == 1)
    return at::matmul(b.squeeze(3).squeeze(2), a.squeeze(3).squeeze(2)).unsqueeze(2).unsqueeze(3) * scaling_;
  // As PEFT: conv2d(A^T, B)^T composes the two convolutions into one kernel.
  return at::conv2d(a.permute({1, 0, 2, 3}), b).permute({1, 0, 2, 3}) * scaling_;
}

void LoraAdapter::attach(Model& model) {
  const LayerTargets targets{options_.target_regex, options_.target_modules, options_.layer_types};
  for (auto& [path, layer] : target_layers(model, targets, "lora \"" + options_.name + "\"")) {
    if (layer->adapter(options_.key()))
      throw std::runtime_error("lora: layer \"" + path + "\" already has an adapter named \"" + options_.name + "\"");
    layer->add_adapter(options_.key(), std::make_shared<LoraDelta>(*layer, options_));
  }
}

std::vector<ParameterRule> LoraAdapter::parameter_rules() const {
  ParameterRule r;
  r.pattern = "(.*\\.)?" + options_.key() + "\\.lora_[AB]";
  r.trainable = true;
  r.dtype = c10::kFloat;
  return {r};
}

std::vector<std::tuple<std::string, nn::AdaptableLayer*, std::shared_ptr<LoraDelta>>> LoraAdapter::attached(
    const Model& model) const {
  std::vector<std::tuple<std::string, nn::AdaptableLayer*, std::shared_ptr<LoraDelta>>> out;
  for (const auto& item : model.named_modules("", false)) {
    auto* layer = dynamic_cast<nn::AdaptableLayer*>(item.value().get());
    if (!layer) continue;
    if (auto d = std::dynamic_pointer_cast<LoraDelta>(layer->adapter(options_.key()))) out.emplace_back(item.key(), layer, d);
  }
  return out;
}

void LoraAdapter::set_active(Model& model, bool active) {
  for (auto& [path, layer, d] : attached(model)) d->active = active;
}

void LoraAdapter::merge(Model& model) {
  auto layers = attached(model);
  for (auto& [path, layer, d] : layers) {
    auto* conv = dynamic_cast<const nn::Conv2d*>(layer);
    if (!conv || !d->active || d->merged) continue;
    const auto& o = conv->options;
    const bool dilated = (o.dilation[0] != 1 && o.kernel_size[0] > 1) || (o.dilation[1] != 1 && o.kernel_size[1] > 1);
    if (dilated)
      throw std::runtime_error("lora \"" + options_.name + "\": cannot merge into \"" + path + "\": its dilation is " +
                               c10::str(c10::IntArrayRef(o.dilation)) +
                               " and lora_A has none (as PEFT's), so no kernel of the layer equals the adapter "
                               "(PEFT's merge_and_unload changes this layer's output)");
  }
  torch::NoGradGuard no_grad;
  for (auto& [path, layer, d] : layers) {
    if (d->merged || !d->active) continue;  // as PEFT: only active adapters are merged
    auto& w = layer->weight;
    w.copy_((w.to(torch::kFloat) + d->delta_weight().to(w.device())).to(w.scalar_type()));  // in fp32, then cast
    d->merged = true;
  }
}

void LoraAdapter::unmerge(Model& model) {
  torch::NoGradGuard no_grad;
  for (auto& [path, layer, d] : attached(model)) {
    if (!d->merged) continue;
    auto& w = layer->weight;
    w.copy_((w.to(torch::kFloat) - d->delta_weight().to(w.device())).to(w.scalar_type()));
    d->merged = false;
  }
}

void LoraAdapter::eject(Model& model) {
  for (auto& [path, layer, d] : attached(model)) layer->remove_adapter(options_.key());
}

namespace {
std::string peft_key(const std::string& path, const char* factor) {
  return "base_model.model." + path + "." + factor + ".weight";
}

/// The model's module renames (refit/module_names.h): none unless it declares some.
std::vector<ModuleRename> module_renames(const Model& model) {
  auto* names = dynamic_cast<const ReferenceModuleNames*>(&model);
  return names ? names->module_renames() : std::vector<ModuleRename>{};
}
}  // namespace

AdapterFiles LoraAdapter::export_files(const Model& model) const {
  // PEFT addresses modules by their names in memory: a transformers model's, which may differ
  // from the file names refit's paths follow.
  const auto renames = module_renames(model);
  AdapterFiles f;
  std::vector<std::string> targets;
  for (const auto& [path, layer, d] : attached(model)) {
    const std::string name = rename_module_path(path, renames);
    f.tensors[peft_key(name, "lora_A")] = d->lora_A.detach();
    f.tensors[peft_key(name, "lora_B")] = d->lora_B.detach();
    targets.push_back(name);
  }
  f.config = {{"peft_type", "LORA"},
              {"task_type", nullptr},
              {"r", options_.r},
              {"lora_alpha", options_.alpha},
              {"target_modules", targets},
              {"lora_dropout", options_.dropout},
              {"use_rslora", options_.use_rslora},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"init_lora_weights", options_.init == "gaussian" ? nlohmann::json("gaussian") : nlohmann::json(true)},
              {"modules_to_save", nullptr},
              {"base_model_name_or_path", nullptr},
              {"inference_mode", true},
              {"layers_to_transform", nullptr},
              {"layers_pattern", nullptr},
              {"rank_pattern", nlohmann::json::object()},
              {"alpha_pattern", nlohmann::json::object()}};
  return f;
}

void LoraAdapter::import_files(Model& model, const AdapterFiles& files) {
  const auto& c = files.config;
  std::string problems;
  auto expect = [&](const char* key, const nlohmann::json& want) {
    if (c.contains(key) && c[key] != want)
      problems += std::string("\n  ") + key + ": file " + c[key].dump() + ", recipe " + want.dump();
  };
  if (c.contains("peft_type") && c["peft_type"] != "LORA") problems += "\n  peft_type: " + c["peft_type"].dump() + ", expected \"LORA\"";
  expect("r", options_.r);
  if (c.contains("lora_alpha") && std::abs(c["lora_alpha"].get<double>() - options_.alpha) > 1e-12)
    problems += "\n  lora_alpha: file " + c["lora_alpha"].dump() + ", recipe " + nlohmann::json(options_.alpha).dump();
  expect("use_rslora", options_.use_rslora);
  if (c.contains("bias") && c["bias"] != "none") problems += "\n  bias: " + c["bias"].dump() + " (only \"none\" is supported)";
  for (const char* unsupported : {"fan_in_fan_out", "use_dora", "lora_bias"})
    if (c.contains(unsupported) && c[unsupported].is_boolean() && c[unsupported].get<bool>())
      problems += std::string("\n  ") + unsupported + ": true is not supported";
  for (const char* pattern : {"rank_pattern", "alpha_pattern"})
    if (c.contains(pattern) && c[pattern].is_object() && !c[pattern].empty())
      problems += std::string("\n  ") + pattern + ": per-module ranks/alphas are not supported";
  if (!problems.empty()) throw std::runtime_error("lora: the adapter's config does not match the recipe:" + problems);

  // A layer's tensors may be keyed by its path (the file names, as refit wrote them before it
  // knew the in-memory names) or by the reference implementation's in-memory name (PEFT's files).
  const auto renames = module_renames(model);
  auto layers = attached(model);
  std::vector<std::string> names;  // per layer: the name the file uses
  std::set<std::string> expected;
  for (const auto& [path, layer, d] : layers) {
    const std::string memory = rename_module_path(path, renames);
    const bool by_path = files.tensors.count(peft_key(path, "lora_A")) || files.tensors.count(peft_key(path, "lora_B"));
    const bool by_memory =
        memory != path && (files.tensors.count(peft_key(memory, "lora_A")) || files.tensors.count(peft_key(memory, "lora_B")));
    if (by_path && by_memory)
      throw std::runtime_error("lora: the adapter file holds factors for \"" + path + "\" under both of its names (\"" + path +
                               "\", \"" + memory + "\")");
    names.push_back(by_memory ? memory : path);
    for (const char* f : {"lora_A", "lora_B"}) {
      const std::string k = peft_key(names.back(), f);
      expected.insert(k);
      auto it = files.tensors.find(k);
      if (it == files.tensors.end())
        throw std::runtime_error("lora: the adapter file has no " + k +
                                 (memory != path && !by_memory ? " (nor " + peft_key(memory, f) + ")" : ""));
      const auto& dst = std::string(f) == "lora_A" ? d->lora_A : d->lora_B;
      if (it->second.sizes() != dst.sizes())
        throw std::runtime_error("lora: " + k + " has shape " + c10::str(it->second.sizes()) + ", the model expects " +
                                 c10::str(dst.sizes()));
    }
  }
  for (const auto& kv : files.tensors)
    if (!expected.count(kv.first)) throw std::runtime_error("lora: the adapter file holds " + kv.first + ", which no targeted layer has");
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    auto& d = std::get<2>(layers[i]);
    d->lora_A.copy_(files.tensors.at(peft_key(names[i], "lora_A")));
    d->lora_B.copy_(files.tensors.at(peft_key(names[i], "lora_B")));
  }
}

}  // namespace refit::lora
