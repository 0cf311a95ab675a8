#include "train/resume_fingerprint.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "refit/error.h"

namespace refit {

namespace {

std::string component(const ComponentSpec& c) {
  nlohmann::json j{{"type", c.type}, {"config", c.config ? c.config->raw() : nlohmann::json()}};
  return j.dump();
}

}  // namespace

ResumeFingerprint resume_fingerprint(const Recipe& recipe, Precision precision) {
  ResumeFingerprint f;
  const TrainingSpec& t = recipe.training;
  f["/training/batch_size"] = std::to_string(t.batch_size);
  f["/training/gradient_accumulation"] = std::to_string(t.gradient_accumulation);
  f["/training/precision"] = to_string(precision);
  f["/training/seed"] = std::to_string(t.seed);
  f["/training/shuffle"] = t.shuffle ? "true" : "false";
  f["/training/drop_last"] = t.drop_last ? "true" : "false";
  f["/data/train"] = component(recipe.train_data);
  for (std::size_t i = 0; i < recipe.models.size(); ++i) {
    const ModelEntry& m = recipe.models[i];
    const std::string p = "/models/" + std::to_string(i);
    if (m.ema) {
      f[p + "/ema"] = nlohmann::json{{"name", m.spec.name}, {"of", m.ema->of}}.dump();
      f[p + "/dtype"] = dtype_name(m.spec.dtype);
      continue;
    }
    nlohmann::json adapters = nlohmann::json::array();
    for (std::size_t a = 0; a < m.adapters.size(); ++a)
      adapters.push_back(
          {{"component", component(m.adapters[a])}, {"load", m.adapter_loads[a] ? m.adapter_loads[a]->string() : ""}});
    f[p] = nlohmann::json{{"name", m.spec.name},
                          {"component", component(m.component)},
                          {"weights", m.weights ? m.weights->string() : ""},
                          {"adapters", adapters},
                          {"inputs", m.inputs}}
               .dump();
    f[p + "/trainable"] = m.spec.trainable ? "true" : "false";
    f[p + "/dtype"] = dtype_name(m.spec.dtype);
    // A quantized base is rebuilt from its weights file at each start: its storage must match.
    if (m.spec.storage.quantized())
      f[p + "/storage"] = nlohmann::json{{"format", m.spec.storage.format},
                                         {"blocksize", m.spec.storage.blocksize},
                                         {"double_quantization", m.spec.storage.double_quantization}}
                              .dump();
    nlohmann::json rules = nlohmann::json::array();
    for (const auto& r : m.spec.rules) rules.push_back({r.pattern, r.trainable, dtype_name(r.dtype)});
    f[p + "/parameters"] = rules.dump();
  }
  return f;
}

void check_resume_fingerprint(const ResumeFingerprint& saved, const ResumeFingerprint& current,
                              const std::vector<std::string>& allowed, const std::filesystem::path& checkpoint) {
  std::string problems;
  for (const auto& [key, value] : saved) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    auto it = current.find(key);
    const std::string now = it == current.end() ? "(absent)" : it->second;
    if (now == value) continue;
    auto shorten = [](std::string s) { return s.size() > 120 ? s.substr(0, 117) + "..." : s; };
    problems += "\n  " + key + ": the checkpoint's run had " + shorten(value) + ", this recipe has " + shorten(now);
  }
  if (problems.empty()) return;
  throw Error("checkpoint " + checkpoint.string() +
              " was written by a run that differs from this recipe in what a resume must keep:" + problems +
              "\nResuming would not continue that run. Restore those values, or list the keys in "
              "/training/resume_allow_changes to resume anyway (docs/training-loop.md, \"Checkpoints and resume\").");
}

}  // namespace refit
