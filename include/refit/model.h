#pragma once
// The model interface: a torch Module that reads named fields and returns named outputs.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "refit/error.h"
#include "refit/fields.h"
#include "refit/generation.h"
#include "refit/layers.h"
#include "refit/module_names.h"

namespace refit {

/// Every model the framework runs. Parameter and submodule names are the model's public
/// contract: weights files, adapter targets and adapter files all refer to them.
class Model : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;

  /// The fields forward_fields() reads. The first is the primary input: in a chain of models
  /// (backbone, then head) every model after the first receives the previous model's main
  /// output as its primary input, and reads its other inputs from the data.
  virtual std::vector<std::string> input_fields() const = 0;
  /// The names of the outputs forward_fields() returns; the first is the main output (what a
  /// chain passes on, what the classification objective takes as logits).
  virtual std::vector<std::string> output_fields() const = 0;
  /// `inputs` holds (at least) every field of input_fields(), under the model's own names.
  virtual Fields forward_fields(const Fields& inputs) = 0;

  std::string main_output() const { return output_fields().front(); }

  /// Where a reference implementation names some modules differently in memory than in this
  /// model's files (refit/module_names.h): the differences. A model whose names agree (most)
  /// keeps the default, none.
  virtual std::vector<ModuleRename> module_renames() const { return {}; }

  /// Buffers the reference implementation does not save (PyTorch's `persistent=False`: BERT's
  /// `embeddings.position_ids` in transformers 5), by path. A weights file may hold them (older
  /// files do), and checkpoints keep them; exports of the whole model leave them out, so that the
  /// reference implementation loads the file with no unexpected key.
  virtual std::vector<std::string> non_persistent_buffers() const { return {}; }

  /// A decoder language model returns its token-by-token decoder (refit/generation.h) for
  /// `refit generate`; other models none.
  virtual IncrementalDecoder* decoder() { return nullptr; }

  /// The reference implementation's configuration of this model's architecture, as JSON text (a
  /// transformers `config.json`: the llama model's LlamaConfig), or "" when it has none. A merged
  /// export (`refit export --format merged`) writes it beside the weights, so that the folder
  /// loads with the reference's `from_pretrained`; the export sets its `"dtype"` to the dtype it
  /// writes.
  virtual std::string reference_config() const { return {}; }

  /// Adaptable Linear layers (module paths) that a quantized storage ("dtype": "nf4" / "int8")
  /// keeps dense in the model's dtype: the output projection, which transformers' bitsandbytes
  /// integration also keeps unquantized (a decoder's untied "lm_head"). Default: none.
  virtual std::vector<std::string> dense_layers() const { return {}; }

  /// One line for the run header about how the model was configured, where that is worth
  /// knowing (the bert model: its pooling and normalisation, and which file or the recipe set
  /// them), or "" (the default: nothing printed).
  virtual std::string describe() const { return {}; }

  /// Blocks whose activations can be recomputed in the backward instead of kept
  /// (/models/<i>/gradient_checkpointing), by module path ("encoder.layer.0"). A model that lists
  /// them runs each block for which checkpointed() is true through recompute_in_backward()
  /// (refit/recompute.h). Default: none.
  virtual std::vector<std::string> checkpointable_blocks() const { return {}; }
  /// Set by the framework from the recipe: a subset of checkpointable_blocks().
  void set_checkpointed_blocks(std::set<std::string> blocks) { checkpointed_ = std::move(blocks); }
  bool checkpointed(const std::string& block) const { return checkpointed_.count(block) > 0; }
  const std::set<std::string>& checkpointed_blocks() const { return checkpointed_; }

  /// The recipe's renaming of inputs ("inputs": {"pixel_values": "image"}: the model's field
  /// "pixel_values" is read from the data's field "image"). Set by the framework before training.
  void set_input_mapping(std::map<std::string, std::string> mapping) { input_mapping_ = std::move(mapping); }
  const std::map<std::string, std::string>& input_mapping() const { return input_mapping_; }
  /// The data field that the model's input `name` is read from.
  std::string data_field(const std::string& name) const {
    auto it = input_mapping_.find(name);
    return it == input_mapping_.end() ? name : it->second;
  }

  /// Runs the model on `data`: every input field is taken from `data` under its mapped name,
  /// except the primary one when `primary` is given (a chain's previous main output).
  Fields run(const Fields& data, const torch::Tensor& primary = {}) {
    const auto names = input_fields();
    Fields in;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (i == 0 && primary.defined()) {
        in.set(names[i], primary);
        continue;
      }
      const std::string source = data_field(names[i]);
      if (!data.has(source))
        throw Error("model input \"" + names[i] + "\"" + (source != names[i] ? " (data field \"" + source + "\")" : "") +
                    " is not in the batch (fields: " + data.list() + ")");
      in.set(names[i], data.at(source));
    }
    Fields out = forward_fields(in);
    if (!out.has(main_output()))
      throw Error("model did not return its main output \"" + main_output() + "\" (returned: " + out.list() + ")");
    return out;
  }

 private:
  std::map<std::string, std::string> input_mapping_;
  std::set<std::string> checkpointed_;
};

/// A model with one input field and one output field: implement forward(tensor).
class TensorModel : public Model {
 public:
  explicit TensorModel(std::string input_field = "features", std::string output_field = "output")
      : input_field_(std::move(input_field)), output_field_(std::move(output_field)) {}
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;

  std::vector<std::string> input_fields() const override { return {input_field_}; }
  std::vector<std::string> output_fields() const override { return {output_field_}; }
  Fields forward_fields(const Fields& inputs) override { return Fields{{output_field_, forward(inputs.at(input_field_))}}; }

 private:
  std::string input_field_, output_field_;
};

using ModelPtr = std::shared_ptr<Model>;
using ModelMap = std::map<std::string, ModelPtr>;

/// The model named `name` in `models`; an Error naming the declared models when there is none.
inline Model& model_named(const ModelMap& models, const std::string& name) {
  auto it = models.find(name);
  if (it == models.end() || !it->second) {
    std::string declared;
    for (const auto& kv : models) declared += (declared.empty() ? "" : ", ") + kv.first;
    throw Error("no model named \"" + name + "\" (models: " + declared + ")");
  }
  return *it->second;
}

/// Runs the models of `chain` in order: the first reads its inputs from `data` (its primary
/// input is `primary` instead when given); each later one receives the previous model's main
/// output as its primary input. Returns the last model's outputs.
inline Fields run_chain(const ModelMap& models, const std::vector<std::string>& chain, const Fields& data,
                        torch::Tensor primary = {}) {
  Fields out;
  for (const auto& name : chain) {
    Model& m = model_named(models, name);
    // A LibTorch error inside the forward (a shape that does not fit a layer): name the model,
    // what it was given and, when an adaptable layer (refit/layers.h) raised it, the layer's path
    // and what it got; without c10's backtrace.
    auto inputs = [&] {
      std::string given;
      const auto names = m.input_fields();
      for (std::size_t i = 0; i < names.size(); ++i) {
        const torch::Tensor t = i == 0 && primary.defined() ? primary : data.get(m.data_field(names[i]));
        given += (given.empty() ? "" : ", ") + names[i] + " " +
                 (t.defined() ? c10::str(t.sizes()) + " " + std::string(c10::toString(t.scalar_type())) : "(none)");
      }
      return given;
    };
    try {
      out = m.run(data, primary);
    } catch (const nn::LayerError& e) {
      std::string path = "(a layer outside the model's modules)";
      for (const auto& item : m.named_modules("", /*include_self=*/false))
        if (item.value().get() == e.layer) path = item.key();
      throw Error("model \"" + name + "\" failed in its forward (inputs: " + inputs() + ") at layer " + path + " (" +
                  e.given + "): " + e.what());
    } catch (const c10::Error& e) {
      throw Error("model \"" + name + "\" failed in its forward (inputs: " + inputs() + "): " + e.what_without_backtrace());
    }
    primary = out.at(m.main_output());
  }
  return out;
}

/// The data fields a chain reads (each model's inputs under their mapped names; the primary
/// input of every model after the first, and of the first when `first_primary` is false, comes
/// from the chain, not the data).
inline std::vector<std::string> chain_fields(const ModelMap& models, const std::vector<std::string>& chain,
                                             bool first_primary = true) {
  std::vector<std::string> out;
  for (std::size_t m = 0; m < chain.size(); ++m) {
    auto it = models.find(chain[m]);
    if (it == models.end() || !it->second) continue;
    const auto names = it->second->input_fields();
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (i == 0 && (m > 0 || !first_primary)) continue;
      const std::string f = it->second->data_field(names[i]);
      bool seen = false;
      for (const auto& o : out) seen = seen || o == f;
      if (!seen) out.push_back(f);
    }
  }
  return out;
}

}  // namespace refit
