#include "model/model_registry.h"

#include <set>

#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <ATen/ATen.h>

#include "cuda/cuda_support.h"
#include "quant/quantized_weight.h"
#include "refit/error.h"
#include "refit/layer_targets.h"
#include "refit/regex.h"

namespace refit {

torch::Device resolve_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  std::optional<torch::Device> d;
  try {
    d = torch::Device(name);
  } catch (const std::exception&) {
    throw Error("unknown device \"" + name + "\" (expected cpu, cuda, cuda:N or auto)");
  }
  if (d->is_cuda()) {
    if (!torch::cuda::is_available())
      throw Error("device \"" + name + "\" requested but CUDA is not available on this machine (use \"auto\" or \"cpu\"; " +
                  "refit's CUDA support: " + cuda::support_status() + ")");
    int index = d->has_index() ? d->index() : 0;
    if (index >= static_cast<int>(torch::cuda::device_count()))
      throw Error("device \"" + name + "\" requested but only " + std::to_string(torch::cuda::device_count()) +
                  " CUDA device(s) exist");
  } else if (!d->is_cpu()) {
    throw Error("device \"" + name + "\" is not supported (expected cpu, cuda, cuda:N or auto)");
  }
  return *d;
}

namespace {

/// Can `device` run a matmul in `dtype`? (A probe, not a table: backends change.)
bool device_computes(torch::Device device, c10::ScalarType dtype) {
  try {
    auto a = torch::ones({2, 2}, torch::TensorOptions().device(device).dtype(dtype));
    auto b = at::matmul(a, a);
    return b.defined();
  } catch (const std::exception&) {
    return false;
  }
}

bool is_low(c10::ScalarType t) { return t == c10::kBFloat16 || t == c10::kHalf; }

struct Decision {
  bool trainable;
  c10::ScalarType dtype;
  std::string group;
  std::string owner;
  std::string declared_by;  // for messages
};

std::vector<std::shared_ptr<const re2::RE2>> compile_rules(const ModelSpec& spec) {
  std::vector<std::shared_ptr<const re2::RE2>> patterns;
  for (const auto& r : spec.rules) {
    std::string why;
    patterns.push_back(compile_regex(r.pattern, &why));
    if (!patterns.back())
      throw Error("model \"" + spec.name + "\": parameter rule \"" +
                  (r.pattern.size() > 80 ? r.pattern.substr(0, 80) + "..." : r.pattern) + "\" is not a valid regex: " + why);
  }
  return patterns;
}

/// The model's role and dtype, then every matching rule in order (the last match wins).
Decision decide(const std::string& path, const ModelSpec& spec, const std::vector<std::shared_ptr<const re2::RE2>>& patterns,
                const std::vector<std::string>& owners, std::vector<bool>& rule_matched) {
  Decision d{spec.trainable, spec.dtype, spec.trainable ? spec.name : "", "", "model \"" + spec.name + "\""};
  for (std::size_t i = 0; i < spec.rules.size(); ++i) {
    if (!regex_full_match(path, *patterns[i])) continue;
    rule_matched[i] = true;
    const auto& r = spec.rules[i];
    d.trainable = r.trainable;
    d.dtype = r.dtype;
    d.group = r.trainable ? (r.group.empty() ? spec.name : r.group) : "";
    d.owner = i < owners.size() ? owners[i] : "";
    d.declared_by = d.owner.empty() ? "parameter rule \"" + r.pattern + "\"" : "adapter \"" + d.owner + "\"";
  }
  return d;
}

/// Throws when a parameter's role and dtype cannot train safely under the run's precision.
void check_precision(const Decision& d, Precision precision, const std::string& where) {
  if (d.trainable && d.dtype == c10::kHalf && uses_grad_scaler(precision))
    throw Error(where + ": trainable float16 parameters cannot be trained under fp16-mixed: the gradient scaler "
                        "cannot unscale float16 gradients. Declare the trainable parts float32 (master weights); "
                        "frozen parts may stay float16");
  if (d.trainable && is_low(d.dtype) && precision != Precision::bf16_true)
    throw Error(where + ": trainable parameters declared " + dtype_name(d.dtype) + " but the run's precision is " +
                to_string(precision) +
                ". Trainable weights are kept float32 (master weights) in mixed precision; "
                "declare \"dtype\": \"float32\", or choose \"precision\": \"bf16-true\" to train low-precision "
                "weights on purpose");
  if (!d.trainable && d.dtype == c10::kBFloat16 && precision == Precision::fp16_mixed)
    throw Error(where +
                ": frozen bfloat16 weights cannot run under fp16-mixed: autocast computes in float16, and "
                "the ops it promotes instead of casting (cat, stack, index_put, addcmul, ...) refuse bfloat16 beside "
                "float16 (\"Unexpected floating ScalarType in at::autocast::prioritize\" at the first step: a ViT "
                "joins its bfloat16 class token to float16 patch embeddings); where the ops do run, every bfloat16 "
                "weight is cast to float16 at every step, losing bfloat16's range. Declare the frozen weights "
                "\"dtype\": \"float16\" (the same memory; for GPUs without bfloat16), or choose \"precision\": "
                "\"bf16-mixed\"");
  if (d.trainable && d.dtype == c10::kHalf && precision == Precision::bf16_true)
    throw Error(where + ": bf16-true trains bfloat16 or float32 weights, not float16");
}

/// A rule that matches nothing is a mistake (a typo in a path), never a silent no-op that would
/// leave the parameters it meant under the model's own role and dtype.
void refuse_unmatched_rules(const ModelSpec& spec, const std::vector<std::string>& owners,
                            const std::vector<bool>& rule_matched,
                            const torch::OrderedDict<std::string, torch::Tensor>& params) {
  for (std::size_t i = 0; i < spec.rules.size(); ++i) {
    if (rule_matched[i]) continue;
    const std::string owner = i < owners.size() ? owners[i] : "";
    std::string some;
    std::size_t shown = 0;
    for (const auto& item : params) {
      if (shown == 12) {
        some += ", ...";
        break;
      }
      some += (shown++ ? ", " : "") + item.key();
    }
    throw Error("model \"" + spec.name + "\": parameter rule \"" + spec.rules[i].pattern + "\"" +
                (owner.empty() ? std::string() : " (declared by adapter \"" + owner + "\")") +
                " matches no parameter (a rule matches whole parameter paths; this model's: " + some + ")");
  }
}

/// Packs one adaptable Linear's weight in the model's declared storage (ModelSpec::storage),
/// computing in the model's dtype; errors name the layer.
void quantize_layer(const ModelSpec& spec, const std::string& path, nn::AdaptableLayer& layer, const torch::Tensor& weight) {
  const WeightStorage& st = spec.storage;
  const std::string where = "model \"" + spec.name + "\", layer \"" + path + "\": ";
  const auto shape = weight.sizes();
  if (st.format == "nf4" && shape.back() % st.blocksize != 0)
    throw Error(where + "its input width " + std::to_string(shape.back()) + " is not a multiple of the NF4 blocksize " +
                std::to_string(st.blocksize) + " (each block must lie within one row; choose a blocksize that divides it)");
  try {
    std::shared_ptr<const quant::QuantizedWeight> q;
    if (st.format == "nf4") {
      quant::Nf4Options o;
      o.blocksize = st.blocksize;
      o.double_quantization = st.double_quantization;
      q = quant::make_nf4_weight(weight, o, spec.dtype);
    } else {
      q = quant::make_int8_weight(weight, spec.dtype);
    }
    layer.set_quantized_weight(q);
  } catch (const std::exception& e) {
    throw Error(where + e.what());
  }
}

std::string trainable_quantized_error(const ModelSpec& spec) {
  return "model \"" + spec.name + "\": \"dtype\": \"" + spec.storage.format +
         "\" stores the weights quantized, which cannot train; declare \"trainable\": false and train "
         "adapters on it (QLoRA), or choose a float dtype";
}

/// A frozen model's declared storage: every adaptable Linear's weight the loader did not already
/// pack (WeightTargets::store_linear_weight) is quantized from the values it holds now (a model
/// without a weights file). Returns the packed tensors of every quantized layer, which keep their
/// own dtypes when the model moves.
std::set<const void*> quantize_weights(Model& model, const ModelSpec& spec) {
  if (spec.trainable) throw Error(trainable_quantized_error(spec));
  std::set<const void*> packed;
  std::size_t count = 0;
  torch::NoGradGuard no_grad;
  const auto dense = model.dense_layers();
  const std::set<std::string> keep_dense(dense.begin(), dense.end());
  for (auto& [path, layer] : adaptable_layers(model)) {
    if (layer->kind() != "linear" || keep_dense.count(path)) continue;
    if (!layer->quantized_weight()) {
      // "gguf" packs nothing itself: the loader kept the file's blocks (WeightTargets), and a
      // layer it did not (a dense tensor in the file) stays dense.
      if (!layer->weight.defined() || spec.storage.format == "gguf") continue;
      quantize_layer(spec, path, *layer, layer->weight);
    }
    for (const auto& t : layer->quantized_weight()->tensors()) packed.insert(t.second.unsafeGetTensorImpl());
    ++count;
  }
  if (count == 0 && spec.storage.format == "gguf")
    throw Error("model \"" + spec.name +
                "\": \"dtype\": \"gguf\" keeps the Q4_0, Q4_1 and Q8_0 blocks a GGUF weights file holds the adaptable "
                "Linear weights in, and none of this model's came from one (its weights are not a .gguf file, or "
                "hold these layers in another type): declare \"nf4\" or \"int8\" to quantize them");
  if (count == 0)
    throw Error("model \"" + spec.name + "\": \"dtype\": \"" + spec.storage.format +
                "\" quantizes the weights of adaptable Linear layers (refit::nn::Linear), and this model has none");
  return packed;
}

/// Applies the decisions in place: dtype, device, requires_grad; buffers follow the model.
void apply(RegisteredModel& reg, const std::vector<Decision>& decisions, torch::Device device, Precision precision,
           const std::set<const void*>& packed = {}) {
  // set_data keeps each Parameter's identity (modules, optimizers and adapters hold the same
  // object); `tensor.to()` alone would return a copy and change nothing.
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < reg.parameters.size(); ++i) {
    auto& p = reg.parameters[i].tensor;
    const auto& d = decisions[i];
    if (p.device() != device || p.scalar_type() != d.dtype) p.set_data(p.detach().to(device, d.dtype));
    p.set_requires_grad(d.trainable);
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
  // Buffers follow the model's declared dtype (frozen) or stay float32 (trainable masters).
  const ModelSpec& spec = reg.spec;
  c10::ScalarType buffer_dtype = spec.trainable && precision != Precision::bf16_true ? c10::kFloat : spec.dtype;
  for (auto& b : reg.model->named_buffers(/*recurse=*/true)) {
    auto t = b.value();
    bool floating = at::isFloatingType(t.scalar_type()) && !packed.count(t.unsafeGetTensorImpl());
    auto target = floating ? buffer_dtype : t.scalar_type();
    if (t.device() != device || t.scalar_type() != target) t.set_data(t.detach().to(device, target));
  }
}

}  // namespace

WeightTargets weight_targets(const ModelSpec& spec, const Model& model) {
  WeightTargets t;
  auto patterns = std::make_shared<const std::vector<std::shared_ptr<const re2::RE2>>>(compile_rules(spec));
  t.dtype = [spec, patterns](const std::string& path) {
    std::vector<bool> matched(spec.rules.size(), false);
    return decide(path, spec, *patterns, {}, matched).dtype;
  };
  // "gguf": the blocks a GGUF file holds a Linear weight in, kept as read; a weight in another
  // type (F16, F32) stays dense, in the model's dtype.
  if (spec.storage.format == "gguf" && !spec.trainable) {
    const auto dense = model.dense_layers();
    t.store_linear_blocks = [spec, keep_dense =
                                       std::set<std::string>(dense.begin(), dense.end())](const std::string& path,
                                                                                          nn::AdaptableLayer& layer,
                                                                                          const quant::GgufBlocks& blocks) {
      if (keep_dense.count(path)) return false;
      try {
        layer.set_quantized_weight(quant::make_gguf_weight(blocks, spec.dtype));
      } catch (const std::exception& e) {
        throw Error("model \"" + spec.name + "\", layer \"" + path + "\": " + e.what());
      }
      return true;
    };
    return t;
  }
  // A trainable quantized declaration is refused at registration, before anything is packed.
  if (spec.storage.quantized() && !spec.trainable) {
    const auto dense = model.dense_layers();
    t.store_linear_weight = [spec,
                             keep_dense = std::set<std::string>(dense.begin(), dense.end())](const std::string& path,
                                                                                             nn::AdaptableLayer& layer,
                                                                                             const torch::Tensor& weight) {
      if (keep_dense.count(path)) return false;
      quantize_layer(spec, path, layer, weight);
      return true;
    };
  }
  return t;
}

const RegisteredModel& ModelRegistry::add(ModelPtr model, ModelSpec spec, torch::Device device,
                                          const std::vector<std::string>& owners,
                                          std::vector<std::pair<std::string, AdapterPtr>> adapters) {
  if (!model) throw Error("model \"" + spec.name + "\": factory returned no module");
  for (const auto& m : models_)
    if (m.spec.name == spec.name) throw Error("model \"" + spec.name + "\" is registered twice");
  const auto patterns = compile_rules(spec);

  // 0. A quantized storage replaces the Linear weights by their packed form first (and refuses a
  // trainable model): what is registered below are the parameters that remain.
  std::set<const void*> packed;
  if (spec.storage.quantized()) packed = quantize_weights(*model, spec);
  // 1. Decide every parameter's role and dtype, and check the decisions, before changing anything.
  RegisteredModel reg{spec, model, device, {}, std::move(adapters)};
  std::vector<Decision> decisions;
  std::set<c10::ScalarType> dtypes_used;
  auto params = model->named_parameters(/*recurse=*/true);
  std::vector<bool> rule_matched(spec.rules.size(), false);
  for (const auto& item : params) {
    Decision d = decide(item.key(), spec, patterns, owners, rule_matched);
    std::string where = "model \"" + spec.name + "\", parameter \"" + item.key() + "\" (declared by " + d.declared_by + ")";
    check_precision(d, precision_, where);
    const void* impl = item.value().unsafeGetTensorImpl();
    auto seen = seen_.find(impl);
    if (seen != seen_.end())
      throw Error(where + ": this parameter is already registered as " + seen->second +
                  "; a parameter can belong to one registered model only (share the module, not the weights)");
    for (const auto& earlier : reg.parameters)
      if (earlier.tensor.unsafeGetTensorImpl() == impl)
        throw Error(where + ": the same parameter is reachable under two paths (\"" + earlier.path + "\")");
    dtypes_used.insert(d.dtype);
    decisions.push_back(d);
    reg.parameters.push_back({item.key(), item.value(), d.trainable, d.group, d.owner});
  }
  refuse_unmatched_rules(spec, owners, rule_matched, params);
  for (auto t : dtypes_used)
    if (!device_computes(device, t))
      throw Error("model \"" + spec.name + "\": device " + device.str() + " cannot compute " + dtype_name(t) +
                  "; choose another dtype or device");
  // 2. Apply in place.
  apply(reg, decisions, device, precision_, packed);
  for (const auto& p : reg.parameters) seen_[p.tensor.unsafeGetTensorImpl()] = "\"" + spec.name + ":" + p.path + "\"";
  models_.push_back(std::move(reg));
  return models_.back();
}

const RegisteredModel& ModelRegistry::add_ema(ModelPtr model, ModelSpec spec, const EmaSpec& ema, torch::Device device,
                                              std::vector<std::pair<std::string, AdapterPtr>> adapters) {
  if (!model) throw Error("model \"" + spec.name + "\": factory returned no module");
  for (const auto& m : models_)
    if (m.spec.name == spec.name) throw Error("model \"" + spec.name + "\" is registered twice");
  const RegisteredModel* source = nullptr;
  for (const auto& m : models_)
    if (m.spec.name == ema.of) source = &m;
  if (!source) throw Error("EMA model \"" + spec.name + "\": its source \"" + ema.of + "\" is not registered before it");
  if (source->ema) throw Error("EMA model \"" + spec.name + "\": its source \"" + ema.of + "\" is itself an EMA model");
  if (spec.dtype != c10::kFloat)
    throw Error("EMA model \"" + spec.name + "\" declared " + dtype_name(spec.dtype) +
                ": an EMA step moves each weight by (1 - momentum) of its distance to the source (0.4% at momentum "
                "0.996), below " +
                dtype_name(spec.dtype) +
                " resolution (bfloat16 keeps 8 significant bits), so the "
                "copy would stop following its source. Declare \"dtype\": \"float32\" (frozen parameters are shared "
                "with the source in its dtype anyway)");
  if (device != source->device)
    throw Error("EMA model \"" + spec.name + "\" is on " + device.str() + " but its source \"" + ema.of + "\" is on " +
                source->device.str() + "; an EMA model shares its source's frozen weights and must live on its device");

  // Check the structure before changing anything: the same parameter paths and shapes.
  std::map<std::string, const RegisteredParameter*> by_path;
  for (const auto& p : source->parameters) by_path[p.path] = &p;
  auto params = model->named_parameters(/*recurse=*/true);
  if (params.size() != by_path.size())
    throw Error("EMA model \"" + spec.name + "\" has " + std::to_string(params.size()) + " parameters but its source \"" +
                ema.of + "\" has " + std::to_string(by_path.size()) + " (was it built differently?)");
  for (const auto& item : params) {
    auto it = by_path.find(item.key());
    if (it == by_path.end() || it->second->tensor.sizes() != item.value().sizes())
      throw Error("EMA model \"" + spec.name + "\": parameter \"" + item.key() + "\" does not match its source \"" + ema.of +
                  "\"");
  }

  RegisteredModel reg{spec, model, device, {}, std::move(adapters), ema};
  torch::NoGradGuard no_grad;
  for (const auto& item : params) {
    const RegisteredParameter& src = *by_path.at(item.key());
    auto p = item.value();
    RegisteredParameter rp{item.key(), p, false, "", src.owner};
    if (src.trainable) {
      p.set_data(src.tensor.detach().to(device, spec.dtype).clone());
      rp.ema_source = src.tensor;
    } else {
      p.set_data(src.tensor.detach());  // the same storage: a frozen backbone is not duplicated
      rp.shared = true;
    }
    p.set_requires_grad(false);
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
    reg.parameters.push_back(std::move(rp));
  }
  // Buffers (running statistics, position tables) start as the source's, in the source's dtype.
  auto source_buffers = source->model->named_buffers(/*recurse=*/true);
  for (auto& b : model->named_buffers(/*recurse=*/true)) {
    const torch::Tensor* sb = source_buffers.find(b.key());
    if (!sb) continue;
    auto t = b.value();
    t.set_data(sb->detach().clone());
  }
  for (const auto& p : reg.parameters) seen_[p.tensor.unsafeGetTensorImpl()] = "\"" + spec.name + ":" + p.path + "\"";
  models_.push_back(std::move(reg));
  return models_.back();
}

void ModelRegistry::set_loaded_weights(const std::string& name, LoadedWeights weights) {
  for (auto& m : models_)
    if (m.spec.name == name) {
      m.weights = std::move(weights);
      return;
    }
  throw Error("no registered model \"" + name + "\"");
}

void ModelRegistry::validate_complete() const {
  std::size_t trainable = 0;
  for (const auto& m : models_)
    for (const auto& p : m.parameters) trainable += p.trainable;
  if (trainable == 0) {
    std::string names;
    for (const auto& m : models_) names += (names.empty() ? "" : ", ") + m.spec.name;
    throw Error("no trainable parameter: every registered model (" + names +
                ") is frozen. Declare a model \"trainable\": true, or attach an adapter (e.g. LoRA) to a frozen one");
  }
}

bool is_1d_or_bias(const std::string& path, const torch::Tensor& parameter) {
  if (parameter.dim() <= 1) return true;
  const std::string name = path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
  return name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
}

std::vector<ParameterGroup> ModelRegistry::parameter_groups(const OptimizerSpec& defaults,
                                                            const std::map<std::string, bool>& exempt) const {
  std::vector<ParameterGroup> groups;
  std::set<const void*> no_decay;  // TensorImpl* of 1-D parameters and biases
  auto group_for = [&](const std::string& name, const OptimizerOverrides& o) -> ParameterGroup& {
    for (auto& g : groups)
      if (g.name == name) return g;
    ParameterGroup g;
    g.name = name;
    g.lr = o.lr.value_or(defaults.lr);
    g.weight_decay = o.weight_decay.value_or(defaults.weight_decay);
    g.betas = o.betas.value_or(defaults.betas);
    g.eps = o.eps.value_or(defaults.eps);
    groups.push_back(g);
    return groups.back();
  };
  for (const auto& m : models_) {
    for (const auto& p : m.parameters) {
      if (!p.trainable) continue;
      OptimizerOverrides o = m.spec.optimizer;
      if (p.group != m.spec.name)
        for (const auto& r : m.spec.rules)
          if (r.group == p.group && r.optimizer.any()) o = r.optimizer;
      group_for(p.group, o).parameters.push_back(p.tensor);
      if (is_1d_or_bias(p.path, p.tensor)) no_decay.insert(p.tensor.unsafeGetTensorImpl());
    }
  }
  std::vector<ParameterGroup> out;
  for (auto& g : groups) {
    auto it = exempt.find(g.name);
    const bool exempts = it != exempt.end() ? it->second : defaults.exempt_1d_and_bias;
    if (!exempts || g.weight_decay == 0) {
      out.push_back(std::move(g));
      continue;
    }
    ParameterGroup spared = g;
    spared.name = g.name + ".no_decay";
    spared.weight_decay = 0;
    spared.parameters.clear();
    std::vector<torch::Tensor> decayed;
    for (auto& t : g.parameters) (no_decay.count(t.unsafeGetTensorImpl()) ? spared.parameters : decayed).push_back(t);
    g.parameters = std::move(decayed);
    if (!g.parameters.empty()) out.push_back(std::move(g));
    if (!spared.parameters.empty()) out.push_back(std::move(spared));
  }
  return out;
}

ModelMap ModelRegistry::model_map() const {
  ModelMap out;
  for (const auto& m : models_) out[m.spec.name] = m.model;
  return out;
}

}  // namespace refit
