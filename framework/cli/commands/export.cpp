#include "cli/commands/export.h"

#include <cstdio>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>
#include <torch/utils.h>

#include "core/recipe.h"
#include "io/adapter_files.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "refit/layer_targets.h"
#include "train/checkpoint.h"

namespace refit::cli {

namespace {

/// An adapter's files in its own interchange format: one adapter, that format's layout directly
/// in `out`; several, one folder each ("<model>-<adapter label>").
std::vector<std::filesystem::path> export_adapters(const ModelRegistry& models, const std::string& format,
                                                   const std::filesystem::path& out) {
  std::vector<std::tuple<std::string, std::string, AdapterFiles>> exports;
  std::set<std::string> formats{"merged"};
  for (const auto& m : models.models())
    for (const auto& [label, adapter] : m.adapters) {
      const std::string own = adapter->format();
      if (!own.empty()) formats.insert(own);
      if (own == format) exports.emplace_back(m.spec.name, label, adapter->export_files(*m.model));
    }
  if (exports.empty()) {
    std::vector<std::string> known(formats.begin(), formats.end());
    std::string list;
    for (const auto& f : known) list += (list.empty() ? "" : ", ") + f;
    throw Error("no adapter in this recipe exports the format \"" + format + "\" (formats here: " + list + ")" +
                did_you_mean(format, known));
  }
  std::vector<std::filesystem::path> written;
  for (const auto& [model, label, files] : exports) {
    auto target = exports.size() == 1 ? out : out / (model + "-" + label);
    io::write_adapter_files(target, files);
    written.push_back(target / "adapter_model.safetensors");
    written.push_back(target / "adapter_config.json");
  }
  return written;
}

std::vector<std::filesystem::path> export_merged(const ModelRegistry& models, const std::filesystem::path& out,
                                                 std::optional<c10::ScalarType> merged_dtype) {
  torch::NoGradGuard no_grad;
  // An EMA model's frozen weights share its source's storage; merging writes into base weights,
  // so each model gets its own copy first (else the teacher would carry the student's delta).
  for (const auto& m : models.models())
    for (const auto& p : m.parameters)
      if (p.shared) p.tensor.set_data(p.tensor.detach().clone());
  std::vector<std::filesystem::path> written;
  for (const auto& m : models.models()) {
    // A quantized base is dequantized first (in float32 with --dtype, else in its compute dtype):
    // the merged file holds dense weights, the delta added to the dequantized values.
    std::size_t dequantized = 0;
    std::string format;
    for (auto& [path, layer] : adaptable_layers(*m.model))
      if (const auto& q = layer->quantized_weight()) {
        format = q->format();
        layer->make_dense(merged_dtype ? torch::kFloat : q->compute_dtype());
        ++dequantized;
      }
    if (dequantized > 0)
      std::printf("model \"%s\": %zu %s layers dequantized to %s before merging\n", m.spec.name.c_str(), dequantized,
                  format.c_str(), merged_dtype ? "float32" : dtype_name(m.spec.dtype));
    if (merged_dtype)  // widened first: the merge then adds the delta to the exact base weight in float32
      for (auto& p : m.model->parameters(true))
        if (p.is_floating_point()) p.set_data(p.detach().to(torch::kFloat));
    for (const auto& [label, adapter] : m.adapters) {
      adapter->merge(*m.model);  // in fp32, then cast to the weight's dtype
      adapter->eject(*m.model);
    }
    auto state = model_state(*m.model);
    // Exactly the keys the reference implementation writes: not the buffers it does not save.
    for (const auto& name : m.model->non_persistent_buffers()) state.erase(name);
    if (merged_dtype)
      for (auto& kv : state)
        if (kv.second.is_floating_point()) kv.second = kv.second.to(*merged_dtype);
    const std::string config = m.model->reference_config();
    if (config.empty()) {
      auto file = out / (m.spec.name + ".safetensors");
      io::save_safetensors(file, state, {{"format", "pt"}, {"producer", "refit export --format merged"}});
      written.push_back(file);
      continue;
    }
    // A folder the reference implementation loads as it is (from_pretrained(<out>/<model>)):
    // its config.json, saying the dtype the weights are written in, beside model.safetensors.
    nlohmann::json j = nlohmann::json::parse(config);
    for (const auto& kv : state)
      if (kv.second.is_floating_point()) {
        j["dtype"] = dtype_name(kv.second.scalar_type());
        break;
      }
    const auto folder = out / m.spec.name;
    std::filesystem::create_directories(folder);
    io::save_safetensors(folder / "model.safetensors", state,
                         {{"format", "pt"}, {"producer", "refit export --format merged"}});
    io::write_file_atomic(folder / "config.json", j.dump(2) + "\n");
    written.push_back(folder / "model.safetensors");
    written.push_back(folder / "config.json");
  }
  return written;
}

}  // namespace

std::vector<std::filesystem::path> export_models(const Assembly& assembly,
                                                 const std::optional<std::filesystem::path>& checkpoint,
                                                 const std::string& format, const std::filesystem::path& out,
                                                 std::optional<c10::ScalarType> merged_dtype) {
  if (merged_dtype && format != "merged") throw Error("a dtype applies to merged exports only (--format merged)");
  auto models = assembly.build_models();
  // "none": the recipe's own weights (adapters loaded from PEFT folders, merged into their base).
  if (!checkpoint || checkpoint->string() != "none")
    load_trainable_weights(assembly.checkpoint_to_restore(checkpoint), *models);
  return format == "merged" ? export_merged(*models, out, merged_dtype) : export_adapters(*models, format, out);
}

}  // namespace refit::cli
