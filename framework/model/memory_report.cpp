#include "model/memory_report.h"

#include <cstdio>
#include <set>


namespace refit {

namespace {

std::int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.numel()) * static_cast<std::int64_t>(t.element_size()) : 0;
}

/// Frozen and trainable weights; a storage shared by two models (an EMA model's frozen
/// parameters are its source's) counted once.
void add_weights(const ModelRegistry& models, MemoryBreakdown& m) {
  std::set<const void*> seen;
  for (const auto& rm : models.models()) {
    for (const auto& p : rm.parameters) {
      if (!seen.insert(p.tensor.data_ptr()).second) continue;
      (p.changes_in_training() ? m.trainable_weights : m.frozen_weights) += bytes_of(p.tensor);
    }
    for (const auto& b : rm.model->buffers(/*recurse=*/true))
      if (b.defined() && seen.insert(b.data_ptr()).second) m.frozen_weights += bytes_of(b);
  }
}

/// The measurement's weights, apart from the registry's bookkeeping: every distinct storage the
/// models' modules reach (parameters and buffers, recursively), at its allocated size. A tensor
/// autograd updates (requires_grad) is trainable; so is an EMA model's copy (it changes in
/// training without a gradient: the one thing only the registry knows); the rest is frozen.
void add_live_weights(const ModelRegistry& models, MemoryBreakdown& m) {
  std::set<const void*> ema_copies;
  for (const auto& rm : models.models())
    for (const auto& p : rm.parameters)
      if (p.ema_source.defined()) ema_copies.insert(p.tensor.data_ptr());
  std::set<const void*> seen;
  const auto add = [&](const torch::Tensor& t) {
    if (!t.defined() || !t.has_storage() || !seen.insert(t.storage().data()).second) return;
    const auto bytes = static_cast<std::int64_t>(t.storage().nbytes());
    (t.requires_grad() || ema_copies.count(t.data_ptr()) ? m.trainable_weights : m.frozen_weights) += bytes;
  };
  for (const auto& rm : models.models()) {
    for (const auto& t : rm.model->parameters(/*recurse=*/true)) add(t);
    for (const auto& t : rm.model->buffers(/*recurse=*/true)) add(t);
  }
}

}  // namespace

std::int64_t MemoryBreakdown::total() const {
  return frozen_weights + trainable_weights + gradients + optimizer_state + activations.value_or(0) +
         allocator_cache.value_or(0);
}

nlohmann::json MemoryBreakdown::to_json() const {
  nlohmann::json j{{"frozen_weights", frozen_weights},
                   {"trainable_weights", trainable_weights},
                   {"gradients", gradients},
                   {"optimizer_state", optimizer_state}};
  if (activations) j["activations"] = *activations;
  if (allocator_cache) j["allocator_cache"] = *allocator_cache;
  if (!activations_note.empty()) j["activations_note"] = activations_note;
  return j;
}

MemoryBreakdown estimate_memory(const ModelRegistry& models, const OptimizerSpec& optimizer) {
  MemoryBreakdown m;
  add_weights(models, m);
  const std::int64_t moments = optimizer_state_tensors(optimizer);
  for (const auto& rm : models.models())
    for (const auto& p : rm.parameters)
      if (p.trainable) {
        m.gradients += bytes_of(p.tensor);
        m.optimizer_state += moments * bytes_of(p.tensor);
      }
  return m;
}

MemoryBreakdown measure_memory(const ModelRegistry& models, const Stateful& optimizer) {
  MemoryBreakdown m;
  add_live_weights(models, m);
  for (const auto& rm : models.models())
    for (const auto& p : rm.parameters)
      if (p.trainable) m.gradients += bytes_of(p.tensor.grad());
  for (const auto& [name, t] : optimizer.state_dict()) m.optimizer_state += bytes_of(t);
  return m;
}

int optimizer_state_tensors(const OptimizerSpec& optimizer) {
  return optimizer.type == "sgd" ? (optimizer.momentum > 0 ? 1 : 0) : 2;
}

std::string bytes_string(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string memory_table(const MemoryBreakdown& estimate, const MemoryBreakdown* measured) {
  std::string out;
  char line[160];
  auto row = [&](const char* name, std::optional<std::int64_t> e, std::optional<std::int64_t> m) {
    const std::string es = e ? bytes_string(static_cast<double>(*e)) : "-",
                      ms = m ? bytes_string(static_cast<double>(*m)) : "-";
    if (measured) std::snprintf(line, sizeof line, "  %-18s %12s %12s\n", name, es.c_str(), ms.c_str());
    else
      std::snprintf(line, sizeof line, "  %-18s %12s\n", name, es.c_str());
    out += line;
  };
  if (measured) {
    std::snprintf(line, sizeof line, "  %-18s %12s %12s\n", "memory", "estimated", "measured");
    out += line;
  }
  const MemoryBreakdown none;
  const MemoryBreakdown& m = measured ? *measured : none;
  row("frozen weights", estimate.frozen_weights, m.frozen_weights);
  row("trainable weights", estimate.trainable_weights, m.trainable_weights);
  row("gradients", estimate.gradients, m.gradients);
  row("optimizer state", estimate.optimizer_state, m.optimizer_state);
  row("activations", estimate.activations, m.activations);
  row("allocator cache", estimate.allocator_cache, m.allocator_cache);
  return out;
}

}  // namespace refit
