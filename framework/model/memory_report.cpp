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
  // The optimizers keep their moments in the parameter's dtype (zeros_like), as PyTorch's do.
  const std::int64_t moments = optimizer.type == "sgd" ? (optimizer.momentum > 0 ? 1 : 0) : 2;
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
  add_weights(models, m);
  for (const auto& rm : models.models())
    for (const auto& p : rm.parameters)
      if (p.trainable) m.gradients += bytes_of(p.tensor.grad());
  for (const auto& [name, t] : optimizer.state_dict()) m.optimizer_state += bytes_of(t);
  return m;
}

std::string bytes_string(std::int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else if (b < 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else if (b < 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return buf;
}

std::string memory_table(const MemoryBreakdown& estimate, const MemoryBreakdown* measured) {
  std::string out;
  char line[160];
  auto row = [&](const char* name, std::optional<std::int64_t> e, std::optional<std::int64_t> m) {
    const std::string es = e ? bytes_string(*e) : "-", ms = m ? bytes_string(*m) : "-";
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
