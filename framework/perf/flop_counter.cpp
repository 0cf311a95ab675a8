#include "perf/flop_counter.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>

#include <ATen/record_function.h>

namespace refit::perf {
namespace {

using Shape = std::vector<std::int64_t>;

// What a formula reads of an op's arguments: each tensor's shape, each bool, each bool list (by
// position). Captured when the op starts: the dispatcher's boxed inputs do not outlive the start
// callbacks, and the outputs exist only at the end.
struct Args {
  std::vector<std::optional<Shape>> shapes;
  std::vector<std::optional<bool>> bools;
  std::vector<std::vector<bool>> bool_lists;
};
Args capture(c10::ArrayRef<const c10::IValue> values) {
  Args a;
  const std::size_t n = values.size();
  a.shapes.resize(n);
  a.bools.resize(n);
  a.bool_lists.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& v = values[i];
    if (v.isTensor() && v.toTensor().defined()) a.shapes[i] = v.toTensor().sizes().vec();
    else if (v.isBool())
      a.bools[i] = v.toBool();
    else if (v.isBoolList())
      a.bool_lists[i] = v.toBoolList().vec();
  }
  return a;
}
bool shape_of(const Args& a, std::size_t i, Shape& s) {
  if (i >= a.shapes.size() || !a.shapes[i]) return false;
  s = *a.shapes[i];
  return true;
}

// torch.utils.flop_counter's formulas (FlopCounterMode), one per kind of product.
std::int64_t mm(const Shape& a, const Shape& b) {  // [m, k] x [k, n]
  if (a.size() != 2 || b.size() != 2) return 0;
  return 2 * a[0] * a[1] * b[1];
}
std::int64_t bmm(const Shape& a, const Shape& b) {  // [b, m, k] x [b, k, n]
  if (a.size() != 3 || b.size() != 3) return 0;
  return 2 * a[0] * a[1] * a[2] * b[2];
}
std::int64_t product(const Shape& s, std::size_t from) {
  std::int64_t p = 1;
  for (std::size_t i = from; i < s.size(); ++i) p *= s[i];
  return p;
}
// conv_flop_count: every point of the output (of the input, when transposed) meets the whole
// filter, for every batch item and every pair of output channel and (per-group) input channel.
std::int64_t conv(const Shape& x, const Shape& w, const Shape& out, bool transposed) {
  if (x.size() < 3 || w.size() != x.size() || out.size() != x.size()) return 0;
  const Shape& points = transposed ? x : out;
  return 2 * product(points, 2) * product(w, 2) * x[0] * w[0] * w[1];
}
Shape swap01(Shape s) {
  if (s.size() >= 2) std::swap(s[0], s[1]);
  return s;
}
// sdpa_flop_count: scores = q k^T, then scores v.
std::int64_t attention(const Shape& q, const Shape& k, const Shape& v) {
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) return 0;
  const std::int64_t bh = q[0] * q[1], sq = q[2], d = q[3], sk = k[2], dv = v[3];
  return 2 * bh * sq * d * sk + 2 * bh * sq * sk * dv;
}
// sdpa_backward_flop_count: the scores recomputed, then the gradients of both products (two each).
std::int64_t attention_backward(const Shape& q, const Shape& k, const Shape& v) {
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) return 0;
  const std::int64_t bh = q[0] * q[1], sq = q[2], d = q[3], sk = k[2], dv = v[3];
  return 2 * bh * sq * d * sk + 2 * (2 * bh * sq * dv * sk) + 2 * (2 * bh * sq * sk * d);
}

enum class Kind { mm, addmm, bmm, baddbmm, conv, conv_backward, attention, attention_backward };
struct Formula {
  const char* name;
  Kind kind;
};
constexpr Formula kFormulas[] = {
    {"aten::mm", Kind::mm},
    {"aten::addmm", Kind::addmm},
    {"aten::bmm", Kind::bmm},
    {"aten::baddbmm", Kind::baddbmm},
    // aten::convolution, not aten::_convolution nor the backend kernels it dispatches to (they
    // run inside it: counting the outermost op counts each convolution once).
    {"aten::convolution", Kind::conv},
    {"aten::convolution_backward", Kind::conv_backward},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", Kind::attention},
    {"aten::_scaled_dot_product_flash_attention", Kind::attention},
    {"aten::_scaled_dot_product_efficient_attention", Kind::attention},
    {"aten::_scaled_dot_product_cudnn_attention", Kind::attention},
    {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", Kind::attention_backward},
    {"aten::_scaled_dot_product_flash_attention_backward", Kind::attention_backward},
    {"aten::_scaled_dot_product_efficient_attention_backward", Kind::attention_backward},
    {"aten::_scaled_dot_product_cudnn_attention_backward", Kind::attention_backward},
};

const Formula* formula(const char* name) {
  for (const auto& f : kFormulas)
    if (std::strcmp(f.name, name) == 0) return &f;
  return nullptr;
}

std::int64_t flops(Kind kind, const Args& in, const Args& out) {
  Shape a, b, c;
  switch (kind) {
    case Kind::mm: return shape_of(in, 0, a) && shape_of(in, 1, b) ? mm(a, b) : 0;
    case Kind::addmm: return shape_of(in, 1, a) && shape_of(in, 2, b) ? mm(a, b) : 0;
    case Kind::bmm: return shape_of(in, 0, a) && shape_of(in, 1, b) ? bmm(a, b) : 0;
    case Kind::baddbmm: return shape_of(in, 1, a) && shape_of(in, 2, b) ? bmm(a, b) : 0;
    case Kind::conv: {
      // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
      if (!shape_of(in, 0, a) || !shape_of(in, 1, b) || !shape_of(out, 0, c) || in.bools.size() < 7 || !in.bools[6])
        return 0;
      return conv(a, b, c, *in.bools[6]);
    }
    case Kind::conv_backward: {
      // (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
      //  output_padding, groups, output_mask): the gradient of the input is the transposed
      // convolution of grad_output with the weight; the weight's, a convolution of the input
      // with grad_output (channels and batch swapped).
      Shape g, x, w;
      if (!shape_of(in, 0, g) || !shape_of(in, 1, x) || !shape_of(in, 2, w) || in.bools.size() < 11 || !in.bools[7])
        return 0;
      const bool transposed = *in.bools[7];
      const std::vector<bool>& mask = in.bool_lists[10];
      std::int64_t total = 0;
      if (mask.size() > 0 && mask[0]) total += conv(g, w, x, !transposed);
      if (mask.size() > 1 && mask[1])
        total += transposed ? conv(swap01(g), swap01(x), swap01(w), false) : conv(swap01(x), swap01(g), swap01(w), false);
      return total;
    }
    case Kind::attention: return shape_of(in, 0, a) && shape_of(in, 1, b) && shape_of(in, 2, c) ? attention(a, b, c) : 0;
    case Kind::attention_backward:  // (grad_out, query, key, value, ...)
      return shape_of(in, 1, a) && shape_of(in, 2, b) && shape_of(in, 3, c) ? attention_backward(a, b, c) : 0;
  }
  return 0;
}

// What the observer (plain functions) shares with the counter that installed it.
struct State {
  std::atomic<int> phase{0};
  std::atomic<std::int64_t> by_phase[3] = {};
  std::mutex mutex;
  std::map<std::string, std::int64_t> by_operator;
};
std::mutex installed_mutex;
std::shared_ptr<State> installed;  // the live counter's, or null

thread_local int inside_counted = 0;  // depth of counted ops on this thread

// Both contexts mark a counted op (the end callback decrements the depth); the outermost one
// carries its formula.
struct Nested : at::ObserverContext {};
struct Outermost : at::ObserverContext {
  const Formula* f;
  Args inputs;
  Outermost(const Formula* f, Args inputs) : f(f), inputs(std::move(inputs)) {}
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (fn.scope() != at::RecordScope::FUNCTION) return nullptr;
  const Formula* f = formula(fn.name());
  if (!f) return nullptr;
  if (inside_counted++ > 0) return std::make_unique<Nested>();  // nested: part of the outer op
  return std::make_unique<Outermost>(f, capture(fn.inputs()));
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (!context) return;
  --inside_counted;
  auto* outer = dynamic_cast<Outermost*>(context);
  if (!outer) return;
  std::shared_ptr<State> state;
  {
    std::lock_guard<std::mutex> lock(installed_mutex);
    state = installed;
  }
  if (!state) return;
  const auto& outputs = fn.outputs();
  const std::int64_t n =
      flops(outer->f->kind, outer->inputs, capture(c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size())));
  if (n == 0) return;
  state->by_phase[state->phase.load(std::memory_order_relaxed)].fetch_add(n, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(state->mutex);
  state->by_operator[outer->f->name] += n;
}

}  // namespace

std::int64_t op_flops(const std::string& name, c10::ArrayRef<const c10::IValue> inputs,
                      c10::ArrayRef<const c10::IValue> outputs) {
  const Formula* f = formula(name.c_str());
  return f ? flops(f->kind, capture(inputs), capture(outputs)) : 0;
}

const std::vector<std::string>& counted_operators() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& f : kFormulas) v.emplace_back(f.name);
    return v;
  }();
  return names;
}

FlopCounter::FlopCounter() {
  {
    std::lock_guard<std::mutex> lock(installed_mutex);
    if (installed) throw std::logic_error("a FlopCounter is already counting in this process");
    installed = std::make_shared<State>();
  }
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                      .needsInputs(true)
                                      .needsOutputs(true)
                                      .scopes({at::RecordScope::FUNCTION}));
}

FlopCounter::~FlopCounter() {
  at::removeCallback(handle_);
  std::lock_guard<std::mutex> lock(installed_mutex);
  installed.reset();
}

void FlopCounter::set_phase(StepPhase phase) {
  std::lock_guard<std::mutex> lock(installed_mutex);
  if (installed) installed->phase.store(static_cast<int>(phase), std::memory_order_relaxed);
}

FlopCount FlopCounter::count() const {
  std::shared_ptr<State> state;
  {
    std::lock_guard<std::mutex> lock(installed_mutex);
    state = installed;
  }
  FlopCount c;
  if (!state) return c;
  c.forward = state->by_phase[0].load();
  c.backward = state->by_phase[1].load();
  c.update = state->by_phase[2].load();
  std::lock_guard<std::mutex> lock(state->mutex);
  c.by_operator = state->by_operator;
  return c;
}

}  // namespace refit::perf
