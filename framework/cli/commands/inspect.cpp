#include "cli/commands/inspect.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "data/loader.h"
#include "memory/device_memory.h"
#include "memory/host_allocator.h"
#include "memory/process_memory.h"
#include "model/memory_report.h"
#include "precision/autocast_guard.h"
#include "precision/mode.h"
#include "refit/layer_targets.h"

namespace refit::cli {

namespace {

struct Row {
  std::string name;
  std::int64_t params = 0, trainable = 0;
  std::set<std::string> dtypes;
  std::string device;
  double weight_bytes = 0, grad_bytes = 0, optim_bytes = 0;
};

/// One row per model and one per adapter on it (its parameters' owner), then the total.
std::vector<Row> model_rows(const ModelRegistry& models, int state_tensors) {
  std::vector<Row> rows;
  for (const auto& m : models.models()) {
    std::map<std::string, Row> by_owner;
    std::vector<std::string> order{""};
    for (const auto& p : m.parameters) {
      if (!by_owner.count(p.owner)) {
        if (!p.owner.empty()) order.push_back(p.owner);
        by_owner[p.owner].name = p.owner.empty() ? m.spec.name : "  + " + p.owner;
      }
      Row& r = by_owner[p.owner];
      const auto n = p.tensor.numel();
      // An EMA model's frozen parameters share its source's storage: no memory of their own.
      const double bytes = p.shared ? 0.0 : static_cast<double>(n) * p.tensor.element_size();
      r.params += n;
      r.dtypes.insert(dtype_name(p.tensor.scalar_type()));
      r.device = p.tensor.device().str();
      r.weight_bytes += bytes;
      if (p.trainable) {
        r.trainable += n;
        r.grad_bytes += bytes;
        r.optim_bytes += bytes * state_tensors;
      }
    }
    // A quantized frozen weight is a layer's buffers, not a parameter: counted in the model's row
    // with its packed bytes and its format as the dtype ("nf4", "q4_1").
    Row& base = by_owner[""];
    if (base.name.empty()) base.name = m.spec.name;
    for (auto& [path, layer] : adaptable_layers(*m.model)) {
      const auto q = layer->quantized_weight();
      if (!q) continue;
      std::int64_t n = 1;
      for (auto d : q->shape()) n *= d;
      base.params += n;
      base.dtypes.insert(q->format());
      base.weight_bytes += static_cast<double>(q->bytes());
      for (const auto& t : q->tensors()) base.device = t.second.device().str();
    }
    for (const auto& o : order)
      if (by_owner.count(o)) rows.push_back(by_owner[o]);
  }
  Row total;
  total.name = "total";
  for (const auto& r : rows) {
    total.params += r.params, total.trainable += r.trainable;
    total.weight_bytes += r.weight_bytes, total.grad_bytes += r.grad_bytes, total.optim_bytes += r.optim_bytes;
    total.dtypes.insert(r.dtypes.begin(), r.dtypes.end());
  }
  rows.push_back(total);
  return rows;
}

void print_rows(const std::vector<Row>& rows, std::ostringstream& os) {
  os << std::left << std::setw(22) << "model" << std::right << std::setw(12) << "params" << std::setw(12) << "trainable"
     << "  " << std::left << std::setw(18) << "dtype" << std::setw(8) << "device" << std::right << std::setw(12) << "weights"
     << std::setw(12) << "grads" << std::setw(12) << "optimizer"
     << "\n";
  for (const auto& r : rows) {
    std::string dt;
    for (const auto& d : r.dtypes) dt += (dt.empty() ? "" : ",") + d;
    os << std::left << std::setw(22) << r.name << std::right << std::setw(12) << r.params << std::setw(12) << r.trainable
       << "  " << std::left << std::setw(18) << dt << std::setw(8) << r.device << std::right << std::setw(12)
       << bytes_string(r.weight_bytes) << std::setw(12) << bytes_string(r.grad_bytes) << std::setw(12)
       << bytes_string(r.optim_bytes) << "\n";
  }
}

/// One line per parameter: model, path, trainable, dtype, shape, optimizer group, declared by.
void print_parameters(const Recipe& recipe, const ModelRegistry& models, std::ostringstream& os) {
  // The optimizer group of each trainable parameter (1-D ones and biases may be in "<group>.no_decay").
  std::map<const void*, std::string> group_of;
  for (const auto& g : models.parameter_groups(recipe.optimizer, weight_decay_exemptions(recipe)))
    for (const auto& t : g.parameters) group_of[t.unsafeGetTensorImpl()] = g.name;
  std::size_t name_width = 6, path_width = 10, group_width = 14;
  for (const auto& [impl, group] : group_of) group_width = std::max(group_width, group.size() + 2);
  for (const auto& m : models.models()) {
    name_width = std::max(name_width, m.spec.name.size() + 2);
    for (const auto& p : m.parameters) path_width = std::max(path_width, p.path.size() + 2);
  }
  const int nw = static_cast<int>(name_width), pw = static_cast<int>(path_width), gw = static_cast<int>(group_width);
  os << "\n"
     << std::left << std::setw(nw) << "model" << std::setw(pw) << "parameter" << std::setw(10) << "trainable"
     << std::setw(10) << "dtype" << std::setw(18) << "shape" << std::setw(gw) << "group"
     << "declared by\n";
  for (const auto& m : models.models())
    for (const auto& p : m.parameters) {
      std::string shape = "[";
      for (std::size_t d = 0; d < static_cast<std::size_t>(p.tensor.dim()); ++d)
        shape += (d ? ", " : "") + std::to_string(p.tensor.size(static_cast<std::int64_t>(d)));
      shape += "]";
      const auto group = group_of.find(p.tensor.unsafeGetTensorImpl());
      os << std::left << std::setw(nw) << m.spec.name << std::setw(pw) << p.path << std::setw(10)
         << (p.trainable ? "yes" : (p.ema_source.defined() ? "ema" : "no")) << std::setw(10)
         << dtype_name(p.tensor.scalar_type()) << std::setw(18) << shape << std::setw(gw)
         << (group != group_of.end() ? group->second : "-") << (p.owner.empty() ? "model" : p.owner) << "\n";
    }
}

/// Activations of one training step, measured: a forward and backward of the objective on the
/// first training batch, under the recipe's precision, in training mode; the allocator's peak
/// above the start, less the gradients it made. Leaves no gradient behind.
MemoryBreakdown with_activations(const Assembly& assembly, ModelRegistry& models, MemoryBreakdown m) {
  const torch::Device device = assembly.device();
  if (device.is_cpu()) install_caching_host_allocator();
  try {
    DataLoader loader(assembly.train_data(),
                      LoaderOptions{assembly.recipe().training.batch_size, false, assembly.recipe().training.drop_last, 0});
    const Batch batch = to_device(loader.batch(0, 0), device);
    for (auto& rm : models.models()) rm.model->train(!rm.ema);
    TrainState state;
    auto objective = assembly.objective();
    reset_peak_device_memory(device);
    const auto before = device_memory(device);
    {
      AutocastGuard autocast(device.type(), autocast_dtype(assembly.precision()), uses_autocast(assembly.precision()));
      const LossOutput out = objective->compute(models.model_map(), batch, ObjectiveContext{state, true});
      if (out.loss_sum.requires_grad()) out.loss_sum.backward();
    }
    const auto after = device_memory(device);
    for (auto& rm : models.models())
      for (auto& p : rm.parameters)
        if (p.trainable) p.tensor.mutable_grad() = torch::Tensor();
    if (before && after) {
      m.activations = std::max<std::int64_t>(0, after->peak - before->in_use - m.gradients);
      m.activations_note = "one training batch of " + std::to_string(batch.size()) + ", measured in a forward and backward";
    }
  } catch (const std::exception& e) {
    m.activations_note = std::string("not estimated: ") + e.what();
  }
  return m;
}

/// The run's peak, estimated. On the CPU: the larger of this process's own peak resident size
/// (it has built and loaded the models, with their loading's transients, and run one training
/// batch forward and backward) and the process before the models plus the components above; then
/// the optimizer state, which it never allocates. Against what the machine has free. On a GPU:
/// the components, of the device's memory.
std::string peak_line(const MemoryBreakdown& m, std::optional<std::int64_t> before_models, const torch::Device& device) {
  if (!m.activations) return "  peak: not estimated (the activations were not measured)\n";
  std::ostringstream os;
  if (!device.is_cpu()) {
    os << "  peak (estimate)    " << bytes_string(static_cast<double>(m.total())) << " of " << device.str()
       << "'s memory: the components above\n";
    return os.str();
  }
  const std::int64_t reached =
      std::max({peak_rss_bytes(), resident_bytes().value_or(0), before_models.value_or(0) + m.total() - m.optimizer_state});
  const std::int64_t peak = reached + m.optimizer_state;
  os << "  peak (estimate)    " << bytes_string(static_cast<double>(peak))
     << " resident: what this inspection reached (the models loaded, one batch forward and backward), and the "
        "optimizer state";
  if (const auto free = available_bytes()) {
    os << "; " << bytes_string(static_cast<double>(*free)) << " available here";
    if (peak > *free) os << ": DOES NOT FIT (store the frozen base quantized, \"dtype\": \"nf4\", or a smaller batch)";
  }
  os << "\n";
  return os.str();
}

}  // namespace

std::string inspect(const Assembly& assembly, bool parameters) {
  const Recipe& recipe = assembly.recipe();
  const auto before_models = resident_bytes();
  auto models = assembly.build_models();
  const std::string& opt = recipe.optimizer.type;
  const int state_tensors = optimizer_state_tensors(recipe.optimizer);
  std::ostringstream os;
  os << "precision " << to_string(models->precision()) << ", optimizer " << opt << "\n";
  print_rows(model_rows(*models, state_tensors), os);
  const MemoryBreakdown estimate = with_activations(assembly, *models, estimate_memory(*models, recipe.optimizer));
  os << "\nmemory by component (estimate; refit train measures it)\n" << memory_table(estimate);
  if (!estimate.activations_note.empty()) os << "  activations: " << estimate.activations_note << "\n";
  os << peak_line(estimate, before_models, assembly.device());
  if (parameters) print_parameters(recipe, *models, os);
  return os.str();
}

}  // namespace refit::cli
