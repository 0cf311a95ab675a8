#pragma once
// Gradient checkpointing for model authors: a block run through recompute_in_backward() keeps no
// activations; its backward runs the block's forward again and differentiates that. A model lists
// its blocks in Model::checkpointable_blocks() and runs each one it is asked to
// (Model::checkpointed()) through this (docs/plugins.md, "Gradient checkpointing").
//
// What it gets right, where Python trainers trip:
//  * Adapters inside a frozen block receive gradients. The block's parameters that require
//    gradients (its LoRA factors) are inputs of the recomputing node, so the block's output
//    requires gradients even when its input does not (a frozen embedding's output: the case for
//    which transformers needs `enable_input_require_grads` with PEFT).
//  * The recomputation sees the forward's random numbers: the default CPU generator (dropout
//    masks drawn on the host) and the inputs' device's are set to their state at the forward for
//    the recomputation, then put back, so dropout draws the same masks and the training's RNG
//    stream is not disturbed.
//  * It runs under the forward's autocast state (enabled, dtype) for the inputs' device type,
//    whatever the state of the thread that runs the backward.
//
// Include it in a model's .cpp, not in headers: it brings LibTorch's custom-function machinery.
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include "refit/autocast.h"

namespace refit {

/// The block as a function of its tensor inputs (its parameters are read from the module).
using BlockFunction = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

namespace detail {

/// What the backward needs besides the saved tensors.
struct RecomputeContext : torch::CustomClassHolder {
  BlockFunction block;
  std::size_t inputs = 0;  // the first `inputs` saved tensors are the block's inputs, the rest its parameters
  std::vector<bool> input_requires_grad;
  c10::Device device = torch::kCPU;
  std::vector<torch::Tensor> rng_states;  // the CPU generator's, then the device's (CUDA)
  bool autocast = false;
  c10::ScalarType autocast_dtype = torch::kBFloat16;
};

class RecomputedBlock : public torch::autograd::Function<RecomputedBlock> {
 public:
  static std::recursive_mutex& recompute_mutex() {
    static std::recursive_mutex m;  // recursive: a recomputed block may hold one of its own
    return m;
  }
  /// The default generators a block may draw from: the CPU's, and the device's when it is another.
  static std::vector<at::Generator> generators(c10::Device device) {
    std::vector<at::Generator> g{at::globalContext().defaultGenerator(c10::Device(c10::kCPU))};
    if (!device.is_cpu()) g.push_back(at::globalContext().defaultGenerator(device));
    return g;
  }

  // The tensors come as TensorLists: autograd counts the elements of a TensorList as inputs (a
  // std::vector argument would be one opaque, non-tensor argument).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<RecomputeContext> rc, at::TensorList inputs,
                                                at::TensorList parameters) {
    rc->inputs = inputs.size();
    for (const auto& t : inputs) rc->input_requires_grad.push_back(t.requires_grad());
    rc->device = inputs.front().device();
    rc->autocast = at::autocast::is_autocast_enabled(rc->device.type());
    rc->autocast_dtype = at::autocast::get_autocast_dtype(rc->device.type());
    for (at::Generator& generator : generators(rc->device)) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      rc->rng_states.push_back(generator.get_state());
    }
    torch::autograd::variable_list saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), parameters.begin(), parameters.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["block"] = c10::IValue::make_capsule(rc);
    // Grad mode is off here: no activation is kept. Nor is a cast in autocast's cache: a cached
    // bf16 copy of a trainable weight made now would have no gradient function, and a later use
    // of that weight in the same autocast region would silently get no gradient.
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    torch::Tensor output;
    try {
      output = rc->block(inputs.vec());
    } catch (...) {
      at::autocast::set_autocast_cache_enabled(cache);
      throw;
    }
    at::autocast::set_autocast_cache_enabled(cache);
    return {output};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto rc = c10::static_intrusive_pointer_cast<RecomputeContext>(ctx->saved_data["block"].toCapsule());
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    std::vector<torch::Tensor> inputs;
    for (std::size_t i = 0; i < rc->inputs; ++i)
      inputs.push_back(saved[i].detach().requires_grad_(rc->input_requires_grad[i]));
    torch::Tensor output;
    {
      // The forward's random numbers, then the streams as they were. Held across the whole
      // recomputation: backward passes on two devices' threads share the CPU generator.
      std::lock_guard<std::recursive_mutex> serial(recompute_mutex());
      struct PutBack {
        std::vector<at::Generator> generators;
        std::vector<torch::Tensor> states;
        ~PutBack() {
          for (std::size_t i = 0; i < generators.size(); ++i) {
            std::lock_guard<std::mutex> lock(generators[i].mutex());
            generators[i].set_state(states[i]);
          }
        }
      } put_back{generators(rc->device), {}};
      for (std::size_t i = 0; i < put_back.generators.size(); ++i) {
        std::lock_guard<std::mutex> lock(put_back.generators[i].mutex());
        put_back.states.push_back(put_back.generators[i].get_state());
        put_back.generators[i].set_state(rc->rng_states.at(i));
      }
      torch::AutoGradMode grad(true);
      AutocastGuard autocast(rc->device.type(), rc->autocast_dtype, rc->autocast);
      output = rc->block(inputs);
    }
    // Gradients for the inputs that need one and for every parameter (a parameter the block did
    // not use gets none).
    std::vector<torch::Tensor> wrt;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < saved.size(); ++i)
      if (i < rc->inputs ? rc->input_requires_grad[i] : saved[i].requires_grad()) {
        wrt.push_back(i < rc->inputs ? inputs[i] : saved[i]);
        where.push_back(i);
      }
    torch::autograd::variable_list grads(1 + saved.size());  // slot 0: the context argument
    if (wrt.empty() || !output.requires_grad() || !grad_outputs.at(0).defined()) return grads;
    const auto computed = torch::autograd::grad({output}, wrt, {grad_outputs.at(0)}, /*retain_graph=*/false,
                                                /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t j = 0; j < where.size(); ++j) grads[1 + where[j]] = computed[j];
    return grads;
  }
};

}  // namespace detail

/// `block(inputs)`, its activations recomputed in the backward instead of kept. `module` is the
/// block's module: its parameters that require gradients receive them. Without gradients to
/// compute (no_grad, evaluation, nothing trainable inside or upstream) it is `block(inputs)`.
inline torch::Tensor recompute_in_backward(const torch::nn::Module& module, BlockFunction block,
                                           const std::vector<torch::Tensor>& inputs) {
  std::vector<torch::Tensor> parameters;
  for (const auto& p : module.parameters(/*recurse=*/true))
    if (p.requires_grad()) parameters.push_back(p);
  bool any = !parameters.empty();
  for (const auto& t : inputs) any = any || t.requires_grad();
  if (!torch::GradMode::is_enabled() || !any || inputs.empty()) return block(inputs);
  auto rc = c10::make_intrusive<detail::RecomputeContext>();
  rc->block = std::move(block);
  return detail::RecomputedBlock::apply(rc, at::TensorList(inputs), at::TensorList(parameters)).at(0);
}

}  // namespace refit
