#include "model/weights.h"

#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include "io/gguf.h"
#include "io/gguf_tensor.h"
#include "io/safetensors.h"
#include "io/sampled_digest.h"
#include "model/gguf_names.h"
#include "quant/gguf_blocks.h"
#include "refit/error.h"
#include "refit/layer_targets.h"

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

/// One tensor a weights source offers under the model's name: its shape, and how to read it in a
/// given dtype (one tensor at a time: never the whole model at once).
struct OfferedTensor {
  std::vector<std::int64_t> shape;
  std::string origin;  // how the source names it, when that differs ("GGUF blk.0.attn_q.weight")
  std::function<torch::Tensor(c10::ScalarType)> load;
  /// A GGUF tensor in Q4_0 / Q4_1 / Q8_0: its blocks as read (rows in the model's order).
  std::function<quant::GgufBlocks()> blocks;
};

struct WeightsSource {
  std::string description;  // "weights file X" / "sharded weights X"
  std::map<std::string, OfferedTensor> tensors;
  std::vector<std::string> unexpected;                     // tensors that map to no model name (listed with the rest)
  std::vector<std::function<std::string()>> file_digests;  // each file's sampled_digest(), in a fixed order
};

void add_safetensors(WeightsSource& src, const std::shared_ptr<io::SafetensorsFile>& f) {
  for (const auto& t : f->tensors()) {
    const std::string name = t.name;
    src.tensors[name] = OfferedTensor{t.shape, "", [f, name](c10::ScalarType) { return f->load(name); }};
  }
  src.file_digests.push_back([f] { return "safetensors " + f->sampled_digest(); });
}

WeightsSource safetensors_source(const std::filesystem::path& file) {
  WeightsSource src{"weights file " + file.string(), {}, {}};
  add_safetensors(src, std::make_shared<io::SafetensorsFile>(io::SafetensorsFile::open(file)));
  return src;
}

/// transformers' sharded checkpoint: model.safetensors.index.json's "weight_map" names, for every
/// tensor, the shard (a file beside the index) that holds it. Index and shards must agree.
WeightsSource sharded_source(const std::filesystem::path& index) {
  WeightsSource src{"sharded weights " + index.string(), {}, {}};
  std::ifstream in(index);
  if (!in) throw Error("cannot read " + index.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(index.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(index.string() + ": expected a JSON object with a \"weight_map\" object (a sharded safetensors index)");
  std::map<std::string, std::set<std::string>> by_shard;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) throw Error(index.string() + ": weight_map/" + it.key() + " is not a string");
    const std::string shard = it.value().get<std::string>();
    // A shard is a file beside the index: no folder, no way out of it.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos)
      throw Error(index.string() + ": weight_map/" + it.key() + " names \"" + shard +
                  "\", not a file name in the index's folder");
    by_shard[shard].insert(it.key());
  }
  if (by_shard.empty()) throw Error(index.string() + ": weight_map is empty");
  for (const auto& [shard, names] : by_shard) {
    const auto path = index.parent_path() / shard;
    auto f = std::make_shared<io::SafetensorsFile>(io::SafetensorsFile::open(path));
    for (const auto& n : names)
      if (!f->contains(n))
        throw Error(index.string() + ": weight_map puts \"" + n + "\" in " + shard + ", which does not hold it");
    for (const auto& t : f->tensors())
      if (!names.count(t.name))
        throw Error(index.string() + ": shard " + shard + " holds \"" + t.name + "\", which weight_map does not put there");
    add_safetensors(src, f);
  }
  return src;
}

WeightsSource gguf_source(const std::filesystem::path& file) {
  auto f = std::make_shared<io::GgufFile>(io::GgufFile::open(file));
  WeightsSource src{"weights file " + file.string(), {}, {}, {[f] { return "gguf " + f->sampled_digest(); }}};
  const GgufLlamaLayout layout = gguf_llama_layout(*f);
  for (const auto& t : f->tensors()) {
    const std::string gname = t.name;
    // llama.cpp writes llama 3's rotary frequency factors as a tensor; they follow from the rope
    // scaling in the metadata, which the model computes itself: not a weight.
    if (gname == "rope_freqs.weight") continue;
    const auto name = gguf_to_transformers_name(gname);
    if (!name) {
      src.unexpected.push_back(gname + " " + shape_str(t.shape) + " (a GGUF tensor outside the llama-family names)");
      continue;
    }
    if (src.tensors.count(*name)) throw Error(file.string() + ": two GGUF tensors map to " + *name);
    const auto heads = gguf_qk_permutation_heads(layout, gname);
    const std::string what = file.string() + ": tensor \"" + gname + "\"";
    OfferedTensor offered{t.shape, "GGUF " + gname, [f, gname, heads, what](c10::ScalarType dtype) {
                            auto w = io::load_gguf_tensor(*f, gname, c10::isFloatingType(dtype) ? dtype : c10::kFloat);
                            return heads ? gguf_unpermute_qk_rows(w, *heads, what) : w;
                          }};
    if (quant::gguf_blocks_supported(t.type) && t.shape.size() == 2) {
      offered.blocks = [f, gname, heads, what, shape = t.shape, type = t.type] {
        auto raw = std::make_shared<std::vector<std::uint8_t>>(f->read_raw(gname));
        const auto rows = shape[0];
        torch::Tensor blocks = torch::from_blob(
            raw->data(), {rows, static_cast<std::int64_t>(raw->size()) / rows}, [raw](void*) {}, torch::kUInt8);
        // Blocks run along a row, so the q/k rows permute as whole rows of bytes. Otherwise the
        // tensor keeps the bytes read (the deleter holds them): no second copy.
        if (heads) blocks = gguf_unpermute_qk_rows(blocks, *heads, what).contiguous();
        return quant::GgufBlocks{type, blocks, shape};
      };
    }
    src.tensors[*name] = std::move(offered);
  }
  return src;
}

bool starts_with_gguf_magic(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

WeightsSource open_source(const std::filesystem::path& path, const std::string& model_name) {
  if (std::filesystem::is_directory(path)) {
    if (std::filesystem::exists(path / "model.safetensors")) return safetensors_source(path / "model.safetensors");
    if (std::filesystem::exists(path / "model.safetensors.index.json"))
      return sharded_source(path / "model.safetensors.index.json");
    throw Error("model \"" + model_name + "\": weights folder " + path.string() +
                " holds neither model.safetensors nor model.safetensors.index.json");
  }
  if (path.extension() == ".gguf" || starts_with_gguf_magic(path)) return gguf_source(path);
  if (path.extension() == ".json") return sharded_source(path);
  return safetensors_source(path);
}

}  // namespace

LoadedWeights load_weights(Model& model, const std::filesystem::path& file, const std::string& model_name,
                           const WeightTargets& targets) {
  if (!std::filesystem::exists(file))
    throw Error("model \"" + model_name + "\": weights file " + file.string() + " does not exist");
  WeightsSource src = open_source(file, model_name);
  auto state = model_state(model);
  // A buffer the reference implementation does not save is the model's to compute: loaded when
  // the file has it, not missing when it does not.
  std::set<std::string> optional;
  for (const auto& b : model.non_persistent_buffers()) optional.insert(b);
  std::vector<std::string> missing, unexpected = src.unexpected, mismatched;
  for (const auto& kv : state) {
    auto it = src.tensors.find(kv.first);
    if (it == src.tensors.end()) {
      if (!optional.count(kv.first)) missing.push_back(kv.first + " " + shape_str(kv.second.sizes().vec()));
      continue;
    }
    if (it->second.shape != kv.second.sizes().vec())
      mismatched.push_back(kv.first + ": file " + shape_str(it->second.shape) + ", model " +
                           shape_str(kv.second.sizes().vec()) +
                           (it->second.origin.empty() ? "" : " (" + it->second.origin + ")"));
  }
  for (const auto& [name, t] : src.tensors)
    if (!state.count(name))
      unexpected.push_back(name + " " + shape_str(t.shape) + (t.origin.empty() ? "" : " (" + t.origin + ")"));
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string msg = "model \"" + model_name + "\": " + src.description + " does not match the model";
    list(msg, "missing from the file", missing);
    list(msg, "unexpected in the file", unexpected);
    list(msg, "shape mismatches", mismatched);
    throw Error(msg);
  }
  std::set<std::string> parameters;
  for (const auto& p : model.named_parameters(true)) parameters.insert(p.key());
  std::map<std::string, std::pair<std::string, nn::AdaptableLayer*>> linear_weights;
  if (targets.store_linear_weight || targets.store_linear_blocks)
    for (auto& [path, layer] : adaptable_layers(model))
      if (layer->kind() == "linear" && layer->weight.defined() && !layer->quantized_weight())
        linear_weights[path.empty() ? "weight" : path + ".weight"] = {path, layer};
  torch::NoGradGuard no_grad;
  for (auto& kv : state) {
    auto it = src.tensors.find(kv.first);
    if (it == src.tensors.end()) continue;  // an optional buffer the file lacks
    if (auto lw = linear_weights.find(kv.first); lw != linear_weights.end()) {
      if (targets.store_linear_blocks && it->second.blocks &&
          targets.store_linear_blocks(lw->second.first, *lw->second.second, it->second.blocks()))
        continue;
      if (targets.store_linear_weight) {
        torch::Tensor w = it->second.load(c10::kFloat).to(c10::kFloat);
        if (targets.store_linear_weight(lw->second.first, *lw->second.second, w)) continue;
      }
    }
    if (!parameters.count(kv.first)) {
      kv.second.copy_(it->second.load(kv.second.scalar_type()));
      continue;
    }
    const c10::ScalarType dtype = targets.dtype ? targets.dtype(kv.first) : kv.second.scalar_type();
    torch::Tensor t = it->second.load(dtype);
    // Read in its own dtype, a tensor may come back unconverted (a safetensors file's) or as a
    // view of a larger block; the parameter gets a contiguous tensor of its own.
    t = t.to(dtype).contiguous();
    if (t.device() != kv.second.device()) t = t.to(kv.second.device());
    kv.second.set_data(t);
  }
  io::Fnv1a64 digest;
  for (const auto& d : src.file_digests) digest.add(d() + "\n");
  return {digest.hex(), parameters};
}

}  // namespace refit
