#pragma once
// Loading a model's weights with strict key matching: any missing key, unexpected key or shape
// mismatch is an error that lists them (a readable diff), never a silent partial load. Sources:
// a safetensors file; transformers' sharded checkpoint (model.safetensors.index.json and its
// shards); a folder holding model.safetensors or that index; a llama-family GGUF file (names
// mapped to transformers', q/k rows un-permuted, dequantized, or Q4_0 / Q4_1 / Q8_0 blocks kept as
// read for "dtype": "gguf": model/gguf_names.h, quant/gguf_blocks.h). Tensors are
// read one at a time into the model's parameters in their final dtypes (or handed to a quantized
// storage): the whole model is never held a second time, nor in float32.
#include <filesystem>
#include <functional>
#include <set>
#include <string>

#include "quant/gguf_blocks.h"
#include "refit/layers.h"
#include "refit/model.h"

namespace refit {

/// Where each loaded tensor goes (ModelRegistry's declarations, known before registration).
struct WeightTargets {
  /// The dtype a parameter is read in; unset: the dtype the model built it in.
  std::function<c10::ScalarType(const std::string& path)> dtype;
  /// When set, the weight of each adaptable Linear layer is read in float32 and offered to this
  /// (a quantized storage packs it and returns true); a layer it declines (false) gets a dense
  /// parameter like any other.
  std::function<bool(const std::string& layer_path, nn::AdaptableLayer& layer, const torch::Tensor& weight)>
      store_linear_weight;
  /// When set, the weight of each adaptable Linear layer that a GGUF file holds in Q4_0, Q4_1 or
  /// Q8_0 is offered to this as its blocks first ("dtype": "gguf" keeps them and returns true).
  std::function<bool(const std::string& layer_path, nn::AdaptableLayer& layer, const quant::GgufBlocks& blocks)>
      store_linear_blocks;
};

/// Fills every parameter and buffer of `model` from `file`, one tensor at a time. A parameter
/// is replaced (set_data: its identity stays) by the tensor read in its target dtype, so that a
/// model built with nn::unloaded placeholders only ever holds each weight once, in its final
/// form; buffers are copied into (values cast to their dtype). A buffer named by
/// non_persistent_buffers() is loaded when the file has it and kept otherwise.
/// What load_weights read, for the frozen base's fingerprint (train/checkpoint.h): the source's
/// digest, from the files just read (each file's header and sampled windows of its tensors,
/// io/sampled_digest.h), and the parameters it filled.
struct LoadedWeights {
  std::string digest;
  std::set<std::string> parameters;
};
LoadedWeights load_weights(Model& model, const std::filesystem::path& file, const std::string& model_name,
                           const WeightTargets& targets = {});

/// Every parameter and buffer by path (what a weights file must contain).
std::map<std::string, torch::Tensor> model_state(const Model& model);

}  // namespace refit
