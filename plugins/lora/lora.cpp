#include "lora.h"

#include "fused_delta.h"
#include "refit/layer_targets.h"
#include "refit/module_names.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>

namespace refit::lora {

double LoraOptions::scaling() const {
  return weight * (use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r));
}

LoraOptions LoraOptions::from_config(const ConfigReader& c) {
  LoraOptions o;
  o.name = c.optional<std::string>("name", o.name);
  // The options a combination and a trained adapter both take.
  auto read_shared = [&] {
    o.fused = c.optional<bool>("fused", true);
    o.dropout = c.number_in<double>("dropout", 0.0, 0.0, 1.0);
    o.trainable = c.optional<bool>("trainable", true);
    o.active = c.optional<bool>("active", true);
    o.weight = c.number_in<double>("weight", 1.0, -1e6, 1e6);
    if (o.name.empty() || o.name.find_first_of("./") != std::string::npos)
      c.error("name", "expected a non-empty name without '.' or '/'");
  };
  if (c.has("combine")) {
    // The rank, alpha, layers and rsLoRA come from the sources (as PEFT's add_weighted_adapter).
    for (const char* k : {"r", "alpha", "use_rslora", "use_dora", "target_regex", "target_modules", "layer_types", "init"})
      if (c.has(k)) c.error(k, "a combination takes this from its source adapters (\"combine\"); remove it");
    const ConfigReader cc = c.child("combine");
    LoraCombination m;
    m.adapters = cc.required<std::vector<std::string>>("adapters");
    m.weights = cc.required<std::vector<double>>("weights");
    m.type = cc.choice("type", {"linear", "cat", "svd"}, m.type);
    if (cc.has("svd_rank")) {
      m.svd_rank = cc.number_in<std::int64_t>("svd_rank", 1, 1, 1 << 16);
      if (m.type != "svd") cc.error("svd_rank", "applies to \"type\": \"svd\" only");
    }
    if (cc.has("adapters") && m.adapters.empty())
      cc.error("adapters", "expected the names of one or more earlier lora adapters");
    if (cc.has("weights") && m.weights.size() != m.adapters.size())
      cc.error("weights", "expected one weight per adapter (" + std::to_string(m.adapters.size()) + "), got " +
                              std::to_string(m.weights.size()));
    for (const auto& a : m.adapters)
      if (a == o.name) cc.error("adapters", "an adapter cannot combine itself (\"" + a + "\")");
    o.combine = m;
    read_shared();
    return o;
  }
  o.r = c.number_in<std::int64_t>("r", o.r, 1, 1 << 16);
  o.alpha = c.number_in<double>("alpha", static_cast<double>(o.r), 0.0, 1e6);
  o.use_rslora = c.optional<bool>("use_rslora", false);
  const LayerTargets targets = LayerTargets::from_config(c);  // the SDK's, shared by every adapter
  o.target_regex = targets.target_regex;
  o.target_modules = targets.target_modules;
  o.layer_types = targets.layer_types;
  o.init = c.choice("init", {"kaiming", "gaussian"}, o.init);
  o.use_dora = c.optional<bool>("use_dora", false);
  read_shared();
  return o;
}

LoraDelta::LoraDelta(const nn::AdaptableLayer& layer, const LoraOptions& o)
    : scaling_(o.scaling()), dropout_(o.dropout), fused_(o.fused), dora_(o.use_dora), rslora_(o.use_rslora) {
  // The weight's shape and, for DoRA, its values, dense or quantized (dequantized once here).
  const std::vector<std::int64_t> shape = layer.weight_shape();
  torch::NoGradGuard no_grad;
  const torch::Tensor w = o.use_dora ? layer.dense_weight() : torch::Tensor();
  if (layer.kind() == "conv2d") {
    const auto* conv = static_cast<const nn::Conv2d*>(&layer);
    conv_ = true;
    // As PEFT: lora_A takes the layer's kernel, stride and padding, not its dilation.
    stride_ = conv->options.stride;
    padding_ = conv->options.padding;
    dilation_ = conv->options.dilation;
    lora_A = register_parameter("lora_A", torch::empty({o.r, shape[1], shape[2], shape[3]}, torch::kFloat));
    lora_B = register_parameter("lora_B", torch::zeros({shape[0], o.r, 1, 1}, torch::kFloat));
  } else {
    lora_A = register_parameter("lora_A", torch::empty({o.r, shape[1]}, torch::kFloat));
    lora_B = register_parameter("lora_B", torch::zeros({shape[0], o.r}, torch::kFloat));
  }
  if (o.init == "gaussian") lora_A.normal_(0.0, 1.0 / static_cast<double>(o.r));
  else
    torch::nn::init::kaiming_uniform_(lora_A, std::sqrt(5.0));
  if (dora_) {
    // As PEFT's DoraLinearLayer.update_layer: the norms of W + s B A (B = 0: of W), in float32.
    if (!w.defined() || w.numel() == 0) throw std::runtime_error("lora: DoRA needs the layer's weight");
    auto lw = conv_ ? at::mm(lora_B.view({-1, o.r}), lora_A.view({o.r, -1})).reshape(w.sizes()) : at::matmul(lora_B, lora_A);
    lora_magnitude_vector =
        register_parameter("lora_magnitude_vector", weight_norm(w.to(torch::kFloat), lw, scaling_).contiguous());
  }
}

torch::Tensor LoraDelta::weight_norm(const torch::Tensor& weight, const torch::Tensor& lora_weight, double scaling) const {
  auto sum = weight + scaling * lora_weight;
  // PEFT: Linear torch.linalg.norm(W, dim=1).to(W.dtype); Conv W.norm(p=2, dim=(1, 2, 3), keepdim=True).transpose(1, 0).
  if (!conv_) return at::linalg_vector_norm(sum, 2, {1}).to(sum.scalar_type());
  return at::norm(sum, 2, {1, 2, 3}, true).transpose(1, 0);
}

torch::Tensor LoraDelta::adapt(const torch::Tensor& input, const torch::Tensor& output, const nn::AdaptableLayer& layer) {
  if (!dora_) return nn::LayerAdapter::adapt(input, output, layer);
  // PEFT's DoraLinearVariant / DoraConv2dVariant forward, op for op (dora.py): the input is cast
  // to the factors' dtype (as PEFT's _cast_input_dtype, also under autocast), the norm of
  // W + s B A is computed from a detached B A and detached itself, the base output without its
  // bias is reused unless dropout is on (then the base product is recomputed on the dropped input).
  const bool dropping = dropout_ > 0 && is_training();
  torch::Tensor x = input.scalar_type() == lora_A.scalar_type() ? input : input.to(lora_A.scalar_type());
  if (dropping) x = torch::dropout(x, dropout_, true);
  const torch::Tensor w = layer.dense_weight();  // a quantized weight: dequantized for this forward
  torch::Tensor weight, scale, lora_result, base_result;
  if (!conv_) {
    weight = w.to(x.scalar_type());
    auto lw = at::matmul(lora_B, lora_A).to(x.scalar_type());
    scale = (lora_magnitude_vector / weight_norm(weight, lw.detach(), scaling_).detach()).view({1, -1});
    lora_result = at::linear(at::linear(x, lora_A), lora_B);
  } else {
    weight = w;
    const auto r = lora_A.size(0);
    auto lw = at::mm(lora_B.view({-1, r}), lora_A.view({r, -1})).reshape(w.sizes());
    scale = lora_magnitude_vector / weight_norm(weight, lw.detach(), scaling_).detach();
    lora_result = at::conv2d(at::conv2d(x, lora_A, {}, stride_, padding_), lora_B);
  }
  if (!dropping) {
    base_result = output;
    if (layer.bias.defined()) base_result = conv_ ? output - layer.bias.view({1, -1, 1, 1}) : output - layer.bias;
  } else {
    const bool autocast = at::autocast::is_autocast_enabled(x.device().type());
    auto wx = autocast ? weight : weight.to(x.scalar_type());
    base_result = conv_ ? at::conv2d(x, wx, {}, stride_, padding_, dilation_) : at::linear(x, wx);
  }
  return output + ((scale - 1) * base_result + scale * lora_result * scaling_);
}

torch::Tensor LoraDelta::delta(const torch::Tensor& input) {
  const bool dropping = dropout_ > 0 && is_training();
  if (fused_ && !conv_ && !dropping) return fused_linear_delta(input, lora_A, lora_B, scaling_);
  torch::Tensor h = dropping ? torch::dropout(input, dropout_, true) : input;
  if (!at::autocast::is_autocast_enabled(input.device().type()) && h.scalar_type() != lora_A.scalar_type())
    h = h.to(lora_A.scalar_type());
  torch::Tensor out =
      conv_ ? at::conv2d(at::conv2d(h, lora_A, {}, stride_, padding_), lora_B) : at::linear(at::linear(h, lora_A), lora_B);
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

namespace {
std::atomic<std::uint64_t> merges{0};
torch::Tensor per_row(const torch::Tensor& factor, const torch::Tensor& weight) {
  return weight.dim() == 2 ? factor.reshape({-1, 1}) : factor.reshape({-1, 1, 1, 1});
}
}  // namespace

torch::Tensor LoraDelta::merged_weight(const torch::Tensor& weight, const torch::Tensor& unmerged_base) {
  auto delta = delta_weight().to(weight.device());
  if (!dora_) return weight + delta;
  // PEFT's merge: factor = m / ||W0 + delta|| (W0 without any merged adapter), W <- factor (W + delta).
  merged_norm_ = weight_norm(unmerged_base, delta, 1.0).detach();
  auto factor = lora_magnitude_vector.detach().to(torch::kFloat) / merged_norm_;
  return per_row(factor, weight) * (weight + delta);
}

torch::Tensor LoraDelta::unmerged_weight(const torch::Tensor& weight) const {
  auto delta = delta_weight().to(weight.device());
  if (!dora_) return weight - delta;
  auto factor = lora_magnitude_vector.detach().to(torch::kFloat) / merged_norm_;
  return weight / per_row(factor, weight) - delta;
}

void LoraAdapter::attach(Model& model) {
  if (options_.combine) return attach_combination(model);
  const LayerTargets targets{options_.target_regex, options_.target_modules, options_.layer_types};
  for (auto& [path, layer] : target_layers(model, targets, "lora \"" + options_.name + "\"")) {
    if (layer->adapter(options_.key()))
      throw std::runtime_error("lora: layer \"" + path + "\" already has an adapter named \"" + options_.name + "\"");
    auto d = std::make_shared<LoraDelta>(*layer, options_);
    d->active = options_.active;
    layer->add_adapter(options_.key(), d);
  }
}

void LoraAdapter::attach_combination(Model& model) {
  const LoraCombination& m = *options_.combine;
  const std::string who = "lora \"" + options_.name + "\": combine: ";
  // Every adaptable layer that holds any source (PEFT: the union of the sources' targets).
  struct Site {
    std::string path;
    nn::AdaptableLayer* layer;
    std::vector<std::shared_ptr<LoraDelta>> sources;  // per source, null where it is not attached
  };
  std::vector<Site> sites;
  std::vector<std::int64_t> ranks(m.adapters.size(), 0);
  std::vector<bool> rslora(m.adapters.size(), false);
  for (const auto& item : model.named_modules("", false)) {
    auto* layer = dynamic_cast<nn::AdaptableLayer*>(item.value().get());
    if (!layer) continue;
    Site site{item.key(), layer, {}};
    bool any = false;
    for (std::size_t i = 0; i < m.adapters.size(); ++i) {
      auto d = std::dynamic_pointer_cast<LoraDelta>(layer->adapter("lora_" + m.adapters[i]));
      if (d) {
        if (d->dora())
          throw std::runtime_error(who + "\"" + m.adapters[i] + "\" is a DoRA adapter; only LoRA adapters are combined");
        ranks[i] = d->lora_A.size(0);
        rslora[i] = d->rslora();
        any = true;
      }
      site.sources.push_back(d);
    }
    if (layer->adapter(options_.key()))
      throw std::runtime_error("lora: layer \"" + item.key() + "\" already has an adapter named \"" + options_.name + "\"");
    if (any) sites.push_back(std::move(site));
  }
  for (std::size_t i = 0; i < m.adapters.size(); ++i)
    if (!ranks[i])
      throw std::runtime_error(who + "this model has no lora adapter named \"" + m.adapters[i] +
                               "\" (list it before this one in the model's adapters)");
  std::int64_t r = 0;
  if (m.type == "linear") {
    for (auto k : ranks)
      if (k != ranks[0])
        throw std::runtime_error(who + "\"linear\" needs adapters of one rank, got " + c10::str(c10::IntArrayRef(ranks)) +
                                 " (\"cat\" and \"svd\" take any)");
    r = ranks[0];
  } else if (m.type == "cat") {
    for (auto k : ranks) r += k;
  } else {
    r = m.svd_rank ? m.svd_rank : *std::max_element(ranks.begin(), ranks.end());
  }
  // As PEFT: the new adapter's config is the first source's with r = alpha = the new rank.
  options_.r = r;
  options_.alpha = static_cast<double>(r);
  options_.use_rslora = rslora[0];
  torch::NoGradGuard no_grad;
  for (auto& site : sites) {
    auto d = std::make_shared<LoraDelta>(*site.layer, options_);
    std::vector<torch::Tensor> as, bs;
    std::vector<double> wa, wb, w;
    for (std::size_t i = 0; i < m.adapters.size(); ++i) {
      const auto& s = site.sources[i];
      if (!s) continue;
      const double ws = m.weights[i] * s->scaling();
      as.push_back(s->lora_A.detach());
      bs.push_back(s->lora_B.detach());
      wa.push_back(std::sqrt(std::abs(ws)) * (ws >= 0 ? 1 : -1));
      wb.push_back(std::sqrt(std::abs(ws)));
      w.push_back(m.weights[i]);
      if (m.type == "cat") as.back() = as.back() * m.weights[i] * s->scaling();  // PEFT: A.data * weight * scaling
    }
    // PEFT's task_arithmetic: the weights as a float32 tensor, stacked tensors times weights, summed.
    auto weighted_sum = [](const std::vector<torch::Tensor>& ts, const std::vector<double>& ws) {
      auto stacked = torch::stack(ts);
      std::vector<std::int64_t> shape(stacked.dim(), 1);
      shape[0] = -1;
      return (stacked * torch::tensor(ws, torch::kDouble).to(torch::kFloat).view(shape)).sum(0);
    };
    torch::Tensor A, B;
    if (m.type == "linear") {
      A = weighted_sum(as, wa);
      B = weighted_sum(bs, wb);
    } else if (m.type == "cat") {
      A = torch::zeros_like(d->lora_A);
      B = torch::zeros_like(d->lora_B);
      auto ca = torch::cat(as, 0), cb = torch::cat(bs, 1);
      A.narrow(0, 0, ca.size(0)).copy_(ca);
      B.narrow(1, 0, cb.size(1)).copy_(cb);
    } else {
      std::vector<torch::Tensor> deltas;
      for (std::size_t i = 0; i < m.adapters.size(); ++i)
        if (site.sources[i]) deltas.push_back(site.sources[i]->delta_weight());
      auto delta = weighted_sum(deltas, w);
      const bool conv = delta.dim() == 4;
      if (conv) delta = (delta.size(2) == 1 && delta.size(3) == 1) ? delta.squeeze() : delta.flatten(1);
      if (r > std::min(delta.size(0), delta.size(1)))
        throw std::runtime_error(who + "svd rank " + std::to_string(r) + " exceeds layer \"" + site.path + "\"'s " +
                                 c10::str(delta.sizes()) + " delta");
      auto [U, S, Vh] = at::linalg_svd(delta, true);
      B = at::matmul(U.narrow(1, 0, r), torch::diag(S.narrow(0, 0, r)));
      A = Vh.narrow(0, 0, r);
      if (conv) {
        B = B.reshape(d->lora_B.sizes());
        A = A.reshape(d->lora_A.sizes());
      }
    }
    d->lora_A.copy_(A);
    d->lora_B.copy_(B);
    d->active = options_.active;
    site.layer->add_adapter(options_.key(), d);
  }
}

std::vector<ParameterRule> LoraAdapter::parameter_rules() const {
  ParameterRule r;
  r.pattern = "(.*\\.)?" + options_.key() + "\\.(lora_[AB]|lora_magnitude_vector)";
  r.trainable = options_.trainable;
  r.dtype = c10::kFloat;
  return {r};
}

std::vector<std::tuple<std::string, nn::AdaptableLayer*, std::shared_ptr<LoraDelta>>> LoraAdapter::attached(
    const Model& model) const {
  std::vector<std::tuple<std::string, nn::AdaptableLayer*, std::shared_ptr<LoraDelta>>> out;
  for (const auto& item : model.named_modules("", false)) {
    auto* layer = dynamic_cast<nn::AdaptableLayer*>(item.value().get());
    if (!layer) continue;
    if (auto d = std::dynamic_pointer_cast<LoraDelta>(layer->adapter(options_.key())))
      out.emplace_back(item.key(), layer, d);
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
    // A quantized weight cannot hold the delta: it becomes dense (dequantized in its compute
    // dtype) first, as PEFT's merge_and_unload on a bitsandbytes layer does.
    layer->make_dense(layer->weight_dtype());
    auto& w = layer->weight;
    const auto w32 = w.to(torch::kFloat);
    torch::Tensor base = w32;
    if (d->dora()) {
      // As PEFT's _unmerged_base_weight: DoRA's norm is taken on the weight without the adapters
      // merged into it so far (undone last merged first).
      std::vector<std::pair<std::string, LoraDelta*>> done;
      for (const auto& [key, other] : layer->adapters()) {
        if (!other->merged || other.get() == d.get()) continue;
        auto* o = dynamic_cast<LoraDelta*>(other.get());
        if (!o)
          throw std::runtime_error("lora \"" + options_.name + "\": cannot merge DoRA into \"" + path +
                                   "\": its adapter \"" + key +
                                   "\" is merged and only LoRA adapters can be taken out for DoRA's norm");
        done.emplace_back(key, o);
      }
      std::sort(done.begin(), done.end(),
                [](const auto& a, const auto& b) { return a.second->merge_order > b.second->merge_order; });
      for (const auto& kv : done) base = kv.second->unmerged_weight(base);
    }
    w.copy_(d->merged_weight(w32, base).to(w.scalar_type()));  // in fp32, then cast
    d->merged = true;
    d->merge_order = ++merges;
  }
}

void LoraAdapter::unmerge(Model& model) {
  auto layers = attached(model);
  for (auto& [path, layer, d] : layers) {
    if (!d->merged) continue;
    // Merges are undone last first when DoRA is among them (its factor multiplies the whole weight).
    for (const auto& [key, other] : layer->adapters()) {
      auto* o = dynamic_cast<LoraDelta*>(other.get());
      if (o && o != d.get() && o->merged && o->merge_order > d->merge_order && (o->dora() || d->dora()))
        throw std::runtime_error("lora \"" + options_.name + "\": unmerge \"" + key + "\" from \"" + path +
                                 "\" first: it was merged later and DoRA merges do not commute");
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [path, layer, d] : layers) {
    if (!d->merged) continue;
    auto& w = layer->weight;
    w.copy_(d->unmerged_weight(w.to(torch::kFloat)).to(w.scalar_type()));
    d->merged = false;
  }
}

void LoraAdapter::eject(Model& model) {
  for (auto& [path, layer, d] : attached(model)) layer->remove_adapter(options_.key());
}

namespace {
std::string peft_key(const std::string& path, const std::string& factor) {
  // PEFT saves DoRA's magnitude without the ".weight" of its DoraLinearLayer.
  return "base_model.model." + path + "." + factor + (factor == "lora_magnitude_vector" ? "" : ".weight");
}

/// The tensors of one layer's adapter, by their PEFT names.
std::vector<std::pair<std::string, torch::Tensor>> factors(const LoraDelta& d) {
  std::vector<std::pair<std::string, torch::Tensor>> out{{"lora_A", d.lora_A}, {"lora_B", d.lora_B}};
  if (d.dora()) out.emplace_back("lora_magnitude_vector", d.lora_magnitude_vector);
  return out;
}

}  // namespace

AdapterFiles LoraAdapter::export_files(const Model& model) const {
  // PEFT addresses modules by their names in memory: a transformers model's, which may differ
  // from the file names refit's paths follow.
  const auto renames = model.module_renames();
  AdapterFiles f;
  std::vector<std::string> targets;
  for (const auto& [path, layer, d] : attached(model)) {
    const std::string name = rename_module_path(path, renames);
    for (const auto& [factor, t] : factors(*d)) f.tensors[peft_key(name, factor)] = t.detach();
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
  if (options_.use_dora) f.config["use_dora"] = true;  // absent: PEFT's default, false
  return f;
}

void LoraAdapter::import_files(Model& model, const AdapterFiles& files) {
  const auto& c = files.config;
  std::string problems;
  auto expect = [&](const char* key, const nlohmann::json& want) {
    if (c.contains(key) && c[key] != want)
      problems += std::string("\n  ") + key + ": file " + c[key].dump() + ", recipe " + want.dump();
  };
  if (c.contains("peft_type") && c["peft_type"] != "LORA")
    problems += "\n  peft_type: " + c["peft_type"].dump() + ", expected \"LORA\"";
  expect("r", options_.r);
  // Not a number: a mismatch too (get<double>() threw nlohmann's type_error; found by fuzzing).
  if (c.contains("lora_alpha") &&
      (!c["lora_alpha"].is_number() || std::abs(c["lora_alpha"].get<double>() - options_.alpha) > 1e-12))
    problems += "\n  lora_alpha: file " + c["lora_alpha"].dump() + ", recipe " + nlohmann::json(options_.alpha).dump();
  expect("use_rslora", options_.use_rslora);
  const bool file_dora = c.contains("use_dora") && c["use_dora"].is_boolean() && c["use_dora"].get<bool>();
  if (file_dora != options_.use_dora)
    problems += std::string("\n  use_dora: file ") + (file_dora ? "true" : "false (or absent)") + ", recipe " +
                (options_.use_dora ? "true" : "false");
  if (c.contains("bias") && c["bias"] != "none")
    problems += "\n  bias: " + c["bias"].dump() + " (only \"none\" is supported)";
  for (const char* unsupported : {"fan_in_fan_out", "lora_bias"})
    if (c.contains(unsupported) && c[unsupported].is_boolean() && c[unsupported].get<bool>())
      problems += std::string("\n  ") + unsupported + ": true is not supported";
  for (const char* pattern : {"rank_pattern", "alpha_pattern"})
    if (c.contains(pattern) && c[pattern].is_object() && !c[pattern].empty())
      problems += std::string("\n  ") + pattern + ": per-module ranks/alphas are not supported";
  if (!problems.empty()) throw std::runtime_error("lora: the adapter's config does not match the recipe:" + problems);

  // A layer's tensors may be keyed by its path (the file names, as refit wrote them before it
  // knew the in-memory names) or by the reference implementation's in-memory name (PEFT's files).
  const auto renames = model.module_renames();
  auto layers = attached(model);
  std::vector<std::string> names;  // per layer: the name the file uses
  std::set<std::string> expected;
  for (const auto& [path, layer, d] : layers) {
    const std::string memory = rename_module_path(path, renames);
    const bool by_path = files.tensors.count(peft_key(path, "lora_A")) || files.tensors.count(peft_key(path, "lora_B"));
    const bool by_memory = memory != path && (files.tensors.count(peft_key(memory, "lora_A")) ||
                                              files.tensors.count(peft_key(memory, "lora_B")));
    if (by_path && by_memory)
      throw std::runtime_error("lora: the adapter file holds factors for \"" + path + "\" under both of its names (\"" +
                               path + "\", \"" + memory + "\")");
    names.push_back(by_memory ? memory : path);
    for (const auto& [f, dst] : factors(*d)) {
      const std::string k = peft_key(names.back(), f);
      expected.insert(k);
      auto it = files.tensors.find(k);
      if (it == files.tensors.end())
        throw std::runtime_error("lora: the adapter file has no " + k +
                                 (memory != path && !by_memory ? " (nor " + peft_key(memory, f) + ")" : ""));
      if (it->second.sizes() != dst.sizes())
        throw std::runtime_error("lora: " + k + " has shape " + c10::str(it->second.sizes()) + ", the model expects " +
                                 c10::str(dst.sizes()));
    }
  }
  for (const auto& kv : files.tensors)
    if (!expected.count(kv.first))
      throw std::runtime_error("lora: the adapter file holds " + kv.first + ", which no targeted layer has");
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    auto& d = std::get<2>(layers[i]);
    for (auto& [f, dst] : factors(*d)) dst.copy_(files.tensors.at(peft_key(names[i], f)));
  }
}

}  // namespace refit::lora
