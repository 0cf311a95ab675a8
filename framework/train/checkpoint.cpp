#include "train/checkpoint.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/recipe.h"
#include "io/remove_tree.h"
#include "io/safetensors.h"
#include "refit/error.h"
#include "refit/version.h"
#include "train/rng.h"

namespace fs = std::filesystem;

namespace refit {

namespace {

constexpr const char* kTrainableFile = "trainable.safetensors";
constexpr const char* kStateFile = "state.safetensors";

std::string key_of(const RegisteredModel& m, const RegisteredParameter& p) { return m.spec.name + "/" + p.path; }

void fnv(std::uint64_t& h, const void* data, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
}

std::string step_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

nlohmann::json counters_json(const Counters& c) {
  return {{"step", c.step}, {"iteration", c.iteration}, {"epoch", c.epoch}, {"samples", c.samples},
          {"skipped_iterations", c.skipped_iterations}};
}

}  // namespace

std::string base_fingerprint(const ModelRegistry& models) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& m : models.models())
    for (const auto& p : m.parameters) {
      if (p.changes_in_training()) continue;
      std::string head = m.spec.name + "/" + p.path + ":" + dtype_name(p.tensor.scalar_type());
      for (auto d : p.tensor.sizes()) head += "," + std::to_string(d);
      fnv(h, head.data(), head.size());
      auto cpu = p.tensor.detach().to(torch::kCPU).contiguous();
      fnv(h, cpu.data_ptr(), static_cast<std::size_t>(cpu.numel()) * cpu.element_size());
    }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
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
  // Buffers change in training too (BatchNorm running statistics, in frozen models as well).
  for (const auto& m : models.models())
    for (const auto& b : m.model->named_buffers(true)) train_state["buffer/" + m.spec.name + "/" + b.key()] = b.value();
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
  io::save_safetensors(tmp / kTrainableFile, trainable, {{"base_fingerprint", fingerprint}, {"format", "refit"}});
  io::save_safetensors(tmp / kStateFile, train_state, meta);
  fs::path final_dir = root / name;
  io::remove_tree(final_dir);  // only when the same step is saved again
  fs::rename(tmp, final_dir);
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
  if (fp->second != current)
    throw Error("checkpoint " + dir.string() + " was trained on another frozen base (fingerprint " + fp->second +
                ", this run's base is " + current +
                "): the base model's weights, dtype or architecture differ; refusing to apply it");
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
      if (state_file.contains(k) && state_file.info(k).shape == b.value().sizes().vec())
        b.value().copy_(state_file.load(k));
    }
}

CheckpointState load_checkpoint(const fs::path& dir, ModelRegistry& models, const StateComponents& components,
                                const ResumeFingerprint& current, const std::vector<std::string>& allowed) {
  if (!fs::is_directory(dir)) throw Error("checkpoint " + dir.string() + " does not exist");
  auto state_file = io::SafetensorsFile::open(dir / kStateFile);
  const auto& meta = state_file.metadata();
  auto counters = meta.find("counters");
  if (counters == meta.end()) throw Error("checkpoint " + dir.string() + " has no refit training state");
  CheckpointState s;
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
  for (const auto& m : models.models())
    for (const auto& b : m.model->named_buffers(true)) {
      const std::string k = "buffer/" + m.spec.name + "/" + b.key();
      if (!state_file.contains(k))
        throw Error("checkpoint " + dir.string() + " has no buffer " + m.spec.name + "/" + b.key() +
                    " (written by a refit before 0.4, which did not save buffers, or for another model)");
      if (state_file.info(k).shape != b.value().sizes().vec())
        throw Error("checkpoint " + dir.string() + ": buffer " + m.spec.name + "/" + b.key() + " has another shape");
      buffers.emplace_back(b.value(), k);
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
      if (t.name.compare(0, prefix.size(), prefix) == 0)
        dicts[i][t.name.substr(prefix.size())] = state_file.load(t.name);
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
  auto c = nlohmann::json::parse(counters->second);
  s.counters.step = c["step"];
  s.counters.iteration = c["iteration"];
  s.counters.epoch = c["epoch"];
  s.counters.samples = c["samples"];
  s.counters.skipped_iterations = c["skipped_iterations"];
  if (auto m = meta.find("metric"); m != meta.end()) s.metric = nlohmann::json::parse(m->second).get<double>();
  if (auto m = meta.find("metric_step"); m != meta.end()) s.metric_step = std::stoll(m->second);
  return s;
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  std::ifstream in(root / "latest");
  std::string name;
  if (!in || !std::getline(in, name) || name.empty()) return std::nullopt;
  fs::path dir = root / name;
  if (!fs::is_directory(dir)) return std::nullopt;
  return dir;
}

void apply_retention(const fs::path& root, const RetentionPolicy& policy) {
  std::vector<CheckpointRecord> records;
  std::map<std::int64_t, fs::path> dirs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step-", 0) != 0) continue;
    try {
      auto f = io::SafetensorsFile::open(e.path() / kStateFile);
      auto c = nlohmann::json::parse(f.metadata().at("counters"));
      CheckpointRecord r{c["step"].get<std::int64_t>(), std::nullopt, std::nullopt};
      if (auto m = f.metadata().find("metric"); m != f.metadata().end()) r.metric = nlohmann::json::parse(m->second).get<double>();
      if (auto m = f.metadata().find("metric_step"); m != f.metadata().end()) r.metric_step = std::stoll(m->second);
      records.push_back(r);
      dirs[r.step] = e.path();
    } catch (const std::exception&) {
      // Not a complete checkpoint: never deleted by retention.
    }
  }
  for (auto step : checkpoints_to_delete(records, policy)) io::remove_tree(dirs[step]);
}

}  // namespace refit
