#include "train/checkpoint.h"
#include "train/checkpoint_recovery.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/recipe.h"
#include "io/fault.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "io/sampled_digest.h"
#include "refit/error.h"
#include "refit/layer_targets.h"
#include "refit/version.h"
#include "train/rng.h"

namespace fs = std::filesystem;

namespace refit {

namespace {

/// The packed tensors of a model's quantized Linear weights (refit/quantized.h): buffers that a
/// checkpoint leaves out, since registration rebuilds them from the weights file.
std::set<const void*> packed_weight_tensors(Model& model) {
  std::set<const void*> out;
  for (auto& [path, layer] : adaptable_layers(model))
    if (const auto& q = layer->quantized_weight())
      for (const auto& t : q->tensors()) out.insert(t.second.unsafeGetTensorImpl());
  return out;
}

constexpr const char* kTrainableFile = "trainable.safetensors";
constexpr const char* kStateFile = "state.safetensors";

std::string key_of(const RegisteredModel& m, const RegisteredParameter& p) { return m.spec.name + "/" + p.path; }

std::string step_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

nlohmann::json counters_json(const Counters& c) {
  return {{"step", c.step},
          {"iteration", c.iteration},
          {"epoch", c.epoch},
          {"samples", c.samples},
          {"skipped_iterations", c.skipped_iterations}};
}

/// The counters a checkpoint's metadata holds, each an integer in the range a run can reach:
/// 0 <= step <= max_steps (when max_steps >= 0), 0 <= iteration <= step, 0 <= epoch <= step,
/// 0 <= samples, 0 <= skipped_iterations <= iteration.
Counters parse_counters(const std::string& text, const fs::path& dir, std::int64_t max_steps) {
  const auto c = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (c.is_discarded() || !c.is_object())
    throw Error("checkpoint " + dir.string() + ": its counters are not a JSON object (a damaged file?)");
  auto get = [&](const char* key) -> std::int64_t {
    const auto it = c.find(key);
    if (it == c.end() || !it->is_number_integer() ||
        (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)))
      throw Error("checkpoint " + dir.string() + ": counter " + key + " is missing or not an integer (a damaged file?)");
    return it->get<std::int64_t>();
  };
  Counters r;
  r.step = get("step");
  r.iteration = get("iteration");
  r.epoch = get("epoch");
  r.samples = get("samples");
  r.skipped_iterations = get("skipped_iterations");
  auto check = [&](bool ok, const char* key, std::int64_t value, const std::string& range) {
    if (!ok)
      throw Error("checkpoint " + dir.string() + ": counter " + key + " = " + std::to_string(value) + " is outside " +
                  range + " (a damaged file, or a checkpoint of another run?)");
  };
  const std::string step_range = max_steps >= 0 ? "[0, " + std::to_string(max_steps) + "], this run's steps" : "[0, ...)";
  check(r.step >= 0 && (max_steps < 0 || r.step <= max_steps), "step", r.step, step_range);
  check(r.iteration >= 0 && r.iteration <= r.step, "iteration", r.iteration, "[0, step]");
  check(r.epoch >= 0 && r.epoch <= r.step, "epoch", r.epoch, "[0, step]");
  check(r.samples >= 0, "samples", r.samples, "[0, ...)");
  check(r.skipped_iterations >= 0 && r.skipped_iterations <= r.iteration, "skipped_iterations", r.skipped_iterations,
        "[0, iteration]");
  return r;
}

/// The watched metric a checkpoint's metadata holds, if any.
std::optional<double> parse_metric(const std::map<std::string, std::string>& meta, const fs::path& dir) {
  const auto m = meta.find("metric");
  if (m == meta.end()) return std::nullopt;
  const auto j = nlohmann::json::parse(m->second, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_number())
    throw Error("checkpoint " + dir.string() + ": its metric is not a number (a damaged file?)");
  return j.get<double>();
}

std::optional<std::int64_t> parse_metric_step(const std::map<std::string, std::string>& meta, const fs::path& dir) {
  const auto m = meta.find("metric_step");
  if (m == meta.end()) return std::nullopt;
  const auto j = nlohmann::json::parse(m->second, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_number_integer() || j.get<std::int64_t>() < 0)
    throw Error("checkpoint " + dir.string() + ": its metric_step is not a step (a damaged file?)");
  return j.get<std::int64_t>();
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string base_fingerprint(const ModelRegistry& models, BaseFingerprint how) {
  io::Fnv1a64 h;
  const bool digests = how == BaseFingerprint::file_digests;
  for (const auto& m : models.models()) {
    // A model read from weights files: their digest stands for the bytes of its own tensors. The
    // heads below still pin every frozen tensor's name, dtype and shape (a storage declared
    // differently is another base); other frozen parameters (an adapter's) are hashed whole.
    const bool from_files = digests && !m.weights.digest.empty();
    if (from_files) h.add(m.spec.name + " weights " + m.weights.digest + "\n");
    for (const auto& p : m.parameters) {
      if (p.changes_in_training()) continue;
      std::string head = m.spec.name + "/" + p.path + ":" + dtype_name(p.tensor.scalar_type());
      for (auto d : p.tensor.sizes()) head += "," + std::to_string(d);
      h.add(head);
      if (from_files && m.weights.parameters.count(p.path)) continue;
      auto cpu = p.tensor.detach().to(torch::kCPU).contiguous();
      h.add(cpu.data_ptr(), static_cast<std::size_t>(cpu.numel()) * cpu.element_size());
    }
  }
  // A quantized base's packed weights are buffers, not parameters, and are the base as much.
  for (const auto& m : models.models()) {
    const bool from_files = digests && !m.weights.digest.empty();
    const auto packed = packed_weight_tensors(*m.model);
    for (const auto& b : m.model->named_buffers(true)) {
      if (!packed.count(b.value().unsafeGetTensorImpl())) continue;
      std::string head = m.spec.name + "/" + b.key();
      if (from_files) {
        head += std::string(":") + dtype_name(b.value().scalar_type());
        for (auto d : b.value().sizes()) head += "," + std::to_string(d);
        h.add(head);
        continue;
      }
      h.add(head);
      auto cpu = b.value().detach().to(torch::kCPU).contiguous();
      h.add(cpu.data_ptr(), static_cast<std::size_t>(cpu.numel()) * cpu.element_size());
    }
  }
  return h.hex();
}

fs::path save_checkpoint(const fs::path& root, const ModelRegistry& models, const std::string& fingerprint,
                         const StateComponents& components, const CheckpointState& state) {
  std::map<std::string, torch::Tensor> trainable, train_state;
  for (const auto& m : models.models())
    for (const auto& p : m.parameters) {
      if (!p.changes_in_training()) continue;
      trainable[key_of(m, p)] = p.tensor;  // trained weights and EMA copies
      // Inside an accumulation window the gradients so far are part of the state.
      // (Between windows they are none, or zeros kept for a CUDA graph: not saved.)
      if (state.in_window && p.trainable && p.tensor.grad().defined()) train_state["grad/" + key_of(m, p)] = p.tensor.grad();
    }
  // Buffers change in training too (BatchNorm running statistics, in frozen models as well);
  // a quantized base's packed weights do not, and are rebuilt from the weights file.
  for (const auto& m : models.models()) {
    const auto packed = packed_weight_tensors(*m.model);
    for (const auto& b : m.model->named_buffers(true))
      if (!packed.count(b.value().unsafeGetTensorImpl())) train_state["buffer/" + m.spec.name + "/" + b.key()] = b.value();
  }
  nlohmann::json saved_components = nlohmann::json::object();
  for (const auto& [name, component] : components) {
    const StateDict dict = component->state_dict();
    saved_components[name] = !dict.empty();
    for (const auto& kv : dict) train_state[name + "/" + kv.first] = kv.second;
  }

  nlohmann::json meta_counters = counters_json(state.counters);
  std::map<std::string, std::string> meta{{"refit_version", kVersion},
                                          {"base_fingerprint", fingerprint},
                                          {"counters", meta_counters.dump()},
                                          {"components", saved_components.dump()}};
  if (state.metric) meta["metric"] = nlohmann::json(*state.metric).dump();
  if (state.metric_step) meta["metric_step"] = std::to_string(*state.metric_step);
  if (!state.fingerprint.empty()) meta["resume_fingerprint"] = nlohmann::json(state.fingerprint).dump();

  const std::string name = step_name(state.counters.step);
  fs::create_directories(root);
  fs::path tmp = root / ("." + name + ".tmp-" + std::to_string(::getpid()));
  io::remove_tree(tmp);
  fs::create_directories(tmp);
  io::fault_point("checkpoint: create temporary folder");
  // The kind tells a resume that no fallback to the bytes' fingerprint applies (refit < 0.6.0).
  io::save_safetensors(tmp / kTrainableFile, trainable,
                       {{"base_fingerprint", fingerprint}, {"base_fingerprint_kind", "file_digests"}, {"format", "refit"}});
  io::save_safetensors(tmp / kStateFile, train_state, meta);
  fs::path final_dir = root / name;
  // Only when the same step is saved again (a resumed run passing a checkpoint a killed run
  // wrote but `latest` does not name yet): moved away whole, never left half deleted.
  io::remove_tree_atomically(final_dir);
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
    throw Error("cannot move checkpoint " + tmp.string() + " into place: " + std::strerror(errno));
  io::fault_point("checkpoint: rename into place");
  io::write_file_atomic(root / "latest", name + "\n");
  return final_dir;
}

namespace {

/// Checks fingerprint and parameter set, then copies the trainable weights (and, when
/// `state_file` is given, the in-window gradients). Nothing changes when a check fails.
void restore_trainable(const fs::path& dir, ModelRegistry& models, const io::SafetensorsFile* state_file) {
  auto trainable_file = io::SafetensorsFile::open(dir / kTrainableFile);
  auto fp = trainable_file.metadata().find("base_fingerprint");
  if (fp == trainable_file.metadata().end()) throw Error("checkpoint " + dir.string() + " has no base fingerprint");
  const std::string current = base_fingerprint(models);
  bool matches = fp->second == current;
  // A checkpoint written before bases read from files were fingerprinted by their digest (no
  // "base_fingerprint_kind") holds the fingerprint of the base's bytes: accepted when those match
  // (one O(bytes) pass, on that path only).
  const bool bytes_kind = !trainable_file.metadata().count("base_fingerprint_kind");
  const bool any_digest = std::any_of(models.models().begin(), models.models().end(),
                                      [](const RegisteredModel& m) { return !m.weights.digest.empty(); });
  if (!matches && bytes_kind && any_digest) matches = fp->second == base_fingerprint(models, BaseFingerprint::bytes);
  if (!matches)
    throw Error("checkpoint " + dir.string() + " was trained on another frozen base (fingerprint " + fp->second +
                ", this run's base is " + current +
                "): the base model's weights (a weights file's header or sampled bytes: another file, or a "
                "re-export of it), dtype, storage or architecture differ; refusing to apply it");
  std::vector<std::pair<torch::Tensor, std::string>> targets;
  std::set<std::string> expected;
  for (const auto& m : models.models())
    for (const auto& p : m.parameters) {
      if (!p.changes_in_training()) continue;
      std::string k = key_of(m, p);
      expected.insert(k);
      if (!trainable_file.contains(k)) throw Error("checkpoint " + dir.string() + " has no trainable parameter " + k);
      if (trainable_file.info(k).shape != p.tensor.sizes().vec())
        throw Error("checkpoint " + dir.string() + ": parameter " + k + " has another shape");
      targets.emplace_back(p.tensor, k);
    }
  for (const auto& t : trainable_file.tensors())
    if (!expected.count(t.name))
      throw Error("checkpoint " + dir.string() + " holds trainable parameter " + t.name + " that this run does not have");
  // In-window gradients: each one of a trainable parameter of this run, with its shape.
  if (state_file) {
    for (const auto& t : state_file->tensors()) {
      if (t.name.compare(0, 5, "grad/") != 0) continue;
      const std::string k = t.name.substr(5);
      const auto target = std::find_if(targets.begin(), targets.end(), [&](const auto& p) { return p.second == k; });
      if (target == targets.end() || !target->first.requires_grad())
        throw Error("checkpoint " + dir.string() + " holds gradient " + t.name +
                    " of a trainable parameter this run does not have");
      if (t.shape != target->first.sizes().vec())
        throw Error("checkpoint " + dir.string() + ": gradient " + t.name + " has another shape " + shape_text(t.shape) +
                    " than its parameter " + shape_text(target->first.sizes().vec()));
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [tensor, key] : targets) {
    tensor.copy_(trainable_file.load(key));
    if (!state_file || !tensor.requires_grad()) continue;
    const std::string gk = "grad/" + key;
    tensor.mutable_grad() =
        state_file->contains(gk) ? state_file->load(gk).to(tensor.device(), tensor.scalar_type()) : torch::Tensor();
  }
}

}  // namespace

void load_trainable_weights(const fs::path& dir, ModelRegistry& models) {
  if (!fs::is_directory(dir)) throw Error("checkpoint " + dir.string() + " does not exist");
  restore_trainable(dir, models, nullptr);
  // Buffers change in training too (BatchNorm statistics): those the checkpoint holds.
  if (!fs::exists(dir / kStateFile)) return;
  auto state_file = io::SafetensorsFile::open(dir / kStateFile);
  torch::NoGradGuard no_grad;
  for (const auto& m : models.models())
    for (const auto& b : m.model->named_buffers(true)) {
      const std::string k = "buffer/" + m.spec.name + "/" + b.key();
      if (state_file.contains(k) && state_file.info(k).shape == b.value().sizes().vec()) b.value().copy_(state_file.load(k));
    }
}

CheckpointState load_checkpoint(const fs::path& dir, ModelRegistry& models, const StateComponents& components,
                                const ResumeFingerprint& current, const std::vector<std::string>& allowed,
                                std::int64_t max_steps) {
  if (!fs::is_directory(dir)) throw Error("checkpoint " + dir.string() + " does not exist");
  auto state_file = io::SafetensorsFile::open(dir / kStateFile);
  const auto& meta = state_file.metadata();
  auto counters = meta.find("counters");
  if (counters == meta.end()) throw Error("checkpoint " + dir.string() + " has no refit training state");
  // Everything is checked before anything is changed: counters and metric first.
  CheckpointState s;
  s.counters = parse_counters(counters->second, dir, max_steps);
  s.metric = parse_metric(meta, dir);
  s.metric_step = parse_metric_step(meta, dir);
  if (auto f = meta.find("resume_fingerprint"); f != meta.end()) {
    const auto j = nlohmann::json::parse(f->second, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      throw Error("checkpoint " + dir.string() + ": its resume fingerprint is not a JSON object (a damaged file?)");
    for (const auto& [key, value] : j.items()) {
      if (!value.is_string())
        throw Error("checkpoint " + dir.string() + ": its resume fingerprint has a non-string value at " + key);
      s.fingerprint[key] = value.get<std::string>();
    }
    if (!current.empty()) check_resume_fingerprint(s.fingerprint, current, allowed, dir);
  }
  // Every buffer must be there with its shape before anything is changed.
  std::vector<std::pair<torch::Tensor, std::string>> buffers;
  for (const auto& m : models.models()) {
    const auto packed = packed_weight_tensors(*m.model);
    for (const auto& b : m.model->named_buffers(true)) {
      if (packed.count(b.value().unsafeGetTensorImpl())) continue;  // a quantized base: rebuilt, not saved
      const std::string k = "buffer/" + m.spec.name + "/" + b.key();
      if (!state_file.contains(k))
        throw Error("checkpoint " + dir.string() + " has no buffer " + m.spec.name + "/" + b.key() +
                    " (written by a refit before 0.4, which did not save buffers, or for another model)");
      if (state_file.info(k).shape != b.value().sizes().vec())
        throw Error("checkpoint " + dir.string() + ": buffer " + m.spec.name + "/" + b.key() + " has another shape");
      buffers.emplace_back(b.value(), k);
    }
  }
  // Each component's state, gathered by its prefix. A component that saved state must find it.
  nlohmann::json saved = nlohmann::json::object();
  if (auto c = meta.find("components"); c != meta.end()) {
    saved = nlohmann::json::parse(c->second, nullptr, /*allow_exceptions=*/false);
    if (saved.is_discarded() || !saved.is_object())
      throw Error("checkpoint " + dir.string() + ": its component list is not a JSON object (a damaged file?)");
  }
  std::vector<StateDict> dicts(components.size());
  for (std::size_t i = 0; i < components.size(); ++i) {
    const std::string prefix = components[i].first + "/";
    for (const auto& t : state_file.tensors())
      if (t.name.compare(0, prefix.size(), prefix) == 0) dicts[i][t.name.substr(prefix.size())] = state_file.load(t.name);
    const bool expected = !components[i].second->state_dict().empty();
    const auto listed = saved.find(components[i].first);
    const bool was_saved = listed != saved.end() && listed->is_boolean() ? listed->get<bool>() : !dicts[i].empty();
    if (expected && dicts[i].empty() && was_saved)
      throw Error("checkpoint " + dir.string() + " has no state for " + components[i].first);
  }
  restore_trainable(dir, models, &state_file);
  {
    torch::NoGradGuard no_grad;
    for (auto& [tensor, key] : buffers) tensor.copy_(state_file.load(key));
  }
  for (std::size_t i = 0; i < components.size(); ++i)
    if (!dicts[i].empty()) components[i].second->load_state_dict(dicts[i]);
  return s;
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  std::ifstream in(root / "latest");
  std::string name;
  if (!in || !std::getline(in, name) || name.empty()) return std::nullopt;
  // A damaged `latest` never leads outside the checkpoint folder: it names step-<digits>.
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.find_first_not_of("0123456789", 5) != std::string::npos)
    throw Error((root / "latest").string() + " names \"" + name + "\", not a checkpoint (step-<N>)");
  fs::path dir = root / name;
  if (!fs::is_directory(dir)) return std::nullopt;
  return dir;
}

// Never deletes the checkpoint `latest` names; deletes each by renaming it to `.deleting-step-N`
// first (io::remove_tree_atomically): a kill leaves a checkpoint complete or out of the way,
// never a half-deleted `step-N`.
void apply_retention(const fs::path& root, const RetentionPolicy& policy) {
  std::vector<CheckpointRecord> records;
  std::map<std::int64_t, fs::path> dirs;
  std::error_code ec;
  // The checkpoint `latest` names is kept whatever the policy says: a resume starts from it.
  std::optional<fs::path> latest;
  try {
    latest = latest_checkpoint(root);
  } catch (const Error&) {
  }
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step-", 0) != 0) continue;
    try {
      auto f = io::SafetensorsFile::open(e.path() / kStateFile);
      CheckpointRecord r{parse_counters(f.metadata().at("counters"), e.path(), -1).step,
                         parse_metric(f.metadata(), e.path()), parse_metric_step(f.metadata(), e.path())};
      records.push_back(r);
      dirs[r.step] = e.path();
    } catch (const std::exception&) {
      // Not a complete checkpoint: never deleted by retention.
    }
  }
  for (auto step : checkpoints_to_delete(records, policy))
    if (!latest || latest->filename() != dirs[step].filename()) io::remove_tree_atomically(dirs[step]);
}

void recover_checkpoints(const fs::path& root, const RetentionPolicy& policy) {
  io::remove_stale_entries(root);
  // An empty step-N folder is what a file-by-file delete (refit before 0.5) left when killed.
  std::error_code ec;
  std::vector<fs::path> empty;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind("step-", 0) == 0 && e.is_directory() && fs::is_empty(e.path()))
      empty.push_back(e.path());
  for (const auto& p : empty) io::remove_tree(p);
  apply_retention(root, policy);
}

std::string checkpoint_dir_name(std::int64_t step) { return step_name(step); }

}  // namespace refit
