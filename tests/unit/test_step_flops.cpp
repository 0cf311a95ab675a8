// FLOPs of a training step (perf/flop_counter.h, callbacks/compute_meter.h, perf/peak_flops.h).
//
// The golden counts (tests/golden/flops/step_flops.json, tests/golden/make_step_flops.py) are
// PyTorch's FlopCounterMode on the Python peers of one quickstart and one MiniLM micro-batch:
// refit's counter must count the same step to the FLOP, forward and backward apart and per
// operator. A count that missed the frozen-layer rule (a weight gradient computed for a frozen
// layer, 3F instead of 2F), an attention formula off by one product, a LoRA product counted twice
// or missed, or a convolution's backward counted, would be off by megaFLOPs, not by one.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional.h>
#include <torch/nn/modules/linear.h>

#include "callbacks/compute_meter.h"
#include "core/recipe_parser.h"
#include "data/loader.h"
#include "perf/flop_counter.h"
#include "perf/peak_flops.h"
#include "precision/autocast_guard.h"
#include "precision/mode.h"
#include "refit/recompute.h"
#include "run/assembly.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_step_flops {

namespace fs = std::filesystem;
using namespace refit;

namespace {

struct Counted {
  perf::FlopCount count;
  std::int64_t forward_mm = 0, backward_mm = 0;  // by operator and phase, as the fixture keeps them
  std::int64_t length = 0;                       // the batch's padded length (text)
};

/// One forward and backward of the recipe's objective on its first training batch, in training
/// mode, under the recipe's autocast, counted.
Counted count_one_step(const fs::path& recipe, std::vector<std::string> overrides, std::int64_t batch_size) {
  overrides.push_back("output.dir=" + (fs::temp_directory_path() / "refit-tests" / "step-flops").string());
  Assembly assembly(load_recipe(recipe, overrides));
  auto registry = assembly.build_models();
  for (auto& m : registry->models()) m.model->train(true);
  const ModelMap models = registry->model_map();
  DataLoader loader(assembly.train_data(), LoaderOptions{batch_size, false, false, 0});
  const Batch batch = loader.batch(0, 0);
  TrainState state;
  Counted c;
  if (batch.has("input_ids")) c.length = batch.at("input_ids").size(1);
  perf::FlopCounter counter;
  counter.set_phase(perf::StepPhase::forward);
  LossOutput out;
  {
    const Precision p = assembly.precision();
    AutocastGuard autocast(torch::kCPU, autocast_dtype(p), uses_autocast(p));
    out = assembly.objective()->compute(models, batch, ObjectiveContext{state, true});
  }
  counter.set_phase(perf::StepPhase::backward);
  out.loss_sum.backward();
  c.count = counter.count();
  return c;
}

nlohmann::json golden() {
  std::ifstream in(fs::path(test::source_dir()) / "tests/golden/flops/step_flops.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

/// The fixture's per-operator totals of both phases, in refit's operator names ("aten.mm" ->
/// "aten::mm").
std::map<std::string, std::int64_t> by_operator(const nlohmann::json& g) {
  std::map<std::string, std::int64_t> out;
  for (const char* phase : {"forward_by_operator", "backward_by_operator"})
    for (const auto& [name, n] : g.at(phase).items()) {
      std::string op = name;
      op.replace(op.find('.'), 1, "::");
      out[op] += n.get<std::int64_t>();
    }
  return out;
}

void check_against(const perf::FlopCount& c, const nlohmann::json& g) {
  CHECK(c.forward == g.at("forward").get<std::int64_t>());
  CHECK(c.backward == g.at("backward").get<std::int64_t>());
  CHECK(c.update == 0);
  CHECK(c.by_operator == by_operator(g));
}

std::vector<c10::IValue> tensors(std::initializer_list<at::Tensor> ts) {
  std::vector<c10::IValue> v;
  for (const auto& t : ts) v.emplace_back(t);
  return v;
}

/// perf::op_flops() over argument lists held in vectors, as the dispatcher would pass them.
std::int64_t op_flops(const std::string& name, const std::vector<c10::IValue>& inputs,
                      const std::vector<c10::IValue>& outputs) {
  return perf::op_flops(name, c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()),
                        c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()));
}

}  // namespace

TEST_CASE("step FLOPs: one quickstart micro-batch counts what FlopCounterMode counts on transformers + PEFT") {
  const nlohmann::json g = golden().at("quickstart");
  const Counted c =
      count_one_step(fs::path(test::source_dir()) / "recipes/quickstart.json", {}, g.at("batch").get<std::int64_t>());
  check_against(c.count, g);
}

TEST_CASE("step FLOPs: one MiniLM micro-batch counts what FlopCounterMode counts on transformers + PEFT") {
  const nlohmann::json g = golden().at("minilm");
  const Counted c = count_one_step(fs::path(test::source_dir()) / "recipes/text/minilm-lora-bf16.json", {},
                                   g.at("batch").get<std::int64_t>());
  INFO("padded length " << c.length);
  REQUIRE(g.at("by_length").contains(std::to_string(c.length)));
  check_against(c.count, g.at("by_length").at(std::to_string(c.length)));
}

TEST_CASE("step FLOPs: a frozen Linear costs 2F, a trainable one 3F, the first layer's input gradient is never run") {
  torch::manual_seed(0);
  torch::nn::Linear first(torch::nn::LinearOptions(32, 48).bias(false));
  torch::nn::Linear second(torch::nn::LinearOptions(48, 16).bias(false));
  const std::int64_t f1 = 2 * 8 * 32 * 48, f2 = 2 * 8 * 48 * 16;  // one product each, batch 8
  const auto step = [&](bool first_trainable, bool second_trainable) {
    first->weight.set_requires_grad(first_trainable);
    second->weight.set_requires_grad(second_trainable);
    const at::Tensor x = torch::randn({8, 32});  // data: no gradient
    perf::FlopCounter counter;
    counter.set_phase(perf::StepPhase::forward);
    at::Tensor loss = second(first(x)).square().sum();
    counter.set_phase(perf::StepPhase::backward);
    loss.backward();
    return counter.count();
  };
  // A trainable second layer under a frozen first: its weight gradient and its input gradient
  // (F + F), nothing for the frozen first layer, whose input needs no gradient.
  perf::FlopCount c = step(false, true);
  CHECK(c.forward == f1 + f2);
  CHECK(c.backward == f2);
  // A trainable first layer under a frozen second: the second's input gradient (F) carries the
  // gradient down, the first's weight gradient (F); neither's other product runs.
  c = step(true, false);
  CHECK(c.backward == f2 + f1);
  // Both trainable: 3F for the second, 2F for the first (its input gradient is never needed).
  c = step(true, true);
  CHECK(c.backward == 2 * f2 + f1);
  CHECK(c.total() == 3 * f2 + 2 * f1);
}

TEST_CASE("step FLOPs: a recomputed block runs its forward once more inside the backward") {
  torch::manual_seed(0);
  torch::nn::Linear frozen(torch::nn::LinearOptions(64, 64).bias(false));
  frozen->weight.set_requires_grad(false);
  torch::nn::Linear head(torch::nn::LinearOptions(64, 4).bias(false));
  const std::int64_t fb = 2 * 16 * 64 * 64, fh = 2 * 16 * 64 * 4;
  const at::Tensor x = torch::randn({16, 64}, torch::requires_grad());  // makes the block's input gradient run
  const auto step = [&](bool recompute) {
    perf::FlopCounter counter;
    counter.set_phase(perf::StepPhase::forward);
    const BlockFunction block = [&](const std::vector<at::Tensor>& in) { return frozen(in[0]).relu(); };
    at::Tensor h = recompute ? recompute_in_backward(*frozen, block, {x}) : block({x});
    at::Tensor loss = head(h).sum();
    counter.set_phase(perf::StepPhase::backward);
    loss.backward();
    return counter.count();
  };
  const perf::FlopCount plain = step(false), recomputed = step(true);
  CHECK(plain.forward == fb + fh);
  CHECK(plain.backward == 2 * fh + fb);  // head 2F (weight, input), block's input gradient F
  CHECK(recomputed.forward == plain.forward);
  CHECK(recomputed.backward == plain.backward + fb);
}

TEST_CASE("step FLOPs: the formulas are FlopCounterMode's") {
  const at::Tensor a = torch::zeros({3, 5}), b = torch::zeros({5, 7}), bias = torch::zeros({7});
  CHECK(op_flops("aten::mm", tensors({a, b}), {}) == 2 * 3 * 5 * 7);
  CHECK(op_flops("aten::addmm", tensors({bias, a, b}), {}) == 2 * 3 * 5 * 7);
  const at::Tensor ba = torch::zeros({2, 3, 5}), bb = torch::zeros({2, 5, 7});
  CHECK(op_flops("aten::bmm", tensors({ba, bb}), {}) == 2 * 2 * 3 * 5 * 7);
  CHECK(op_flops("aten::baddbmm", tensors({torch::zeros({2, 3, 7}), ba, bb}), {}) == 2 * 2 * 3 * 5 * 7);
  // Attention, [batch, heads, length, head dim]: q k^T and p v forward, five products backward.
  const at::Tensor q = torch::zeros({2, 4, 10, 8}), k = torch::zeros({2, 4, 12, 8}), v = torch::zeros({2, 4, 12, 6});
  const std::int64_t bh = 8;
  CHECK(op_flops("aten::_scaled_dot_product_flash_attention_for_cpu", tensors({q, k, v}), {}) ==
        2 * bh * 10 * 8 * 12 + 2 * bh * 10 * 12 * 6);
  CHECK(op_flops("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                 tensors({torch::zeros({2, 4, 10, 6}), q, k, v}),
                 {}) == 2 * bh * 10 * 8 * 12 + 4 * bh * 10 * 6 * 12 + 4 * bh * 10 * 12 * 8);
  // A convolution: every output point meets the whole filter; its backward, the input and the
  // weight gradients as the output mask asks.
  const at::Tensor x = torch::zeros({2, 3, 8, 8}), w = torch::zeros({5, 3, 3, 3}), y = torch::zeros({2, 5, 6, 6});
  const std::int64_t fc = 2 * 2 * 36 * 5 * 27;
  std::vector<c10::IValue> conv{x,
                                w,
                                c10::IValue(),
                                std::vector<int64_t>{1, 1},
                                std::vector<int64_t>{0, 0},
                                std::vector<int64_t>{1, 1},
                                false,
                                std::vector<int64_t>{0, 0},
                                int64_t{1}};
  CHECK(op_flops("aten::convolution", conv, tensors({y})) == fc);
  const auto backward = [&](std::initializer_list<bool> output_mask) {
    c10::List<bool> mask;
    for (bool b : output_mask) mask.push_back(b);
    std::vector<c10::IValue> in{y,
                                x,
                                w,
                                c10::IValue(),
                                std::vector<int64_t>{1, 1},
                                std::vector<int64_t>{0, 0},
                                std::vector<int64_t>{1, 1},
                                false,
                                std::vector<int64_t>{0, 0},
                                int64_t{1},
                                mask};
    return op_flops("aten::convolution_backward", in, {});
  };
  CHECK(backward({false, true, false}) == fc);  // the weight's gradient only (a first layer)
  CHECK(backward({true, true, false}) == 2 * fc);
  // The counted operators are exactly those with a formula; an op without one costs 0.
  CHECK(op_flops("aten::add", tensors({a, a}), {}) == 0);
  CHECK(op_flops("aten::mm", tensors({ba, bb}), {}) == 0);  // not matrices: no formula applies
  CHECK(perf::counted_operators().size() == 14);
}

TEST_CASE("step FLOPs: products on other threads are counted, nested products once, a second counter refused") {
  const at::Tensor a = torch::randn({16, 16});
  const std::int64_t f = 2 * 16 * 16 * 16;
  perf::FlopCounter counter;
  std::thread t([&] { (void)at::mm(a, a); });  // the autograd engine runs the backward on its own threads
  t.join();
  CHECK(counter.count().forward == f);
  {
    // A product whose kernel dispatches products of its own (a plugin's CPU kernel for aten::bmm
    // that loops over at::mm, say) is counted once, by its own formula.
    const at::Tensor b = torch::randn({3, 16, 16});
    const std::vector<c10::IValue> inputs{b, b};
    RECORD_FUNCTION("aten::bmm", std::vector<c10::IValue>(inputs));
    for (int i = 0; i < 3; ++i) (void)at::mm(b[i], b[i]);
  }
  CHECK(counter.count().forward == f + 3 * f);
  CHECK(counter.count().by_operator.at("aten::bmm") == 3 * f);
  CHECK_THROWS_AS(perf::FlopCounter(), std::logic_error);
}

TEST_CASE("step FLOPs: peaks per CPU vector unit and per GPU model") {
  perf::CpuDescription epyc{"AuthenticAMD", 25, "fpu avx avx2 fma", 0, 2.45, 2};
  auto p = perf::cpu_peak(epyc, false);
  REQUIRE(p);
  CHECK(p->flops_per_second == Approx(2 * 2.45e9 * 32));
  CHECK(p->basis.find("AVX2") != std::string::npos);
  // bf16 products without native kernels run at the fp32 peak.
  CHECK(perf::cpu_peak(epyc, true)->flops_per_second == Approx(p->flops_per_second));
  perf::CpuDescription xeon{"GenuineIntel", 6, "avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile", 3.0, 2.0, 2};
  CHECK(perf::cpu_peak(xeon, false)->flops_per_second == Approx(2 * 3.0e9 * 64));  // the maximum clock, not the current
  CHECK(perf::cpu_peak(xeon, true)->flops_per_second == Approx(2 * 3.0e9 * 1024));
  perf::CpuDescription zen4{"AuthenticAMD", 25, "avx2 fma avx512f avx512_bf16", 0, 2.6, 4};
  CHECK(perf::cpu_peak(zen4, false)->flops_per_second == Approx(4 * 2.6e9 * 32));
  CHECK(perf::cpu_peak(zen4, true)->flops_per_second == Approx(4 * 2.6e9 * 64));  // 512-bit as two 256-bit halves
  const auto h200 = perf::gpu_peak("NVIDIA H200", true);
  REQUIRE(h200);
  CHECK(h200->flops_per_second == Approx(989e12).epsilon(0.01));
  CHECK(perf::gpu_peak("NVIDIA H100 PCIe", false)->flops_per_second == Approx(51.2e12));
  CHECK(perf::gpu_peak("NVIDIA A10", true)->flops_per_second == Approx(125e12));
  CHECK_FALSE(perf::gpu_peak("Some Future GPU 9000", true));
}

TEST_CASE("step FLOPs: the compute meter counts the first whole window and times the later ones") {
  ComputeMeterCallback meter(2, perf::PeakFlops{1e9, "test"});
  TrainState s;
  TrainerControl control;
  const at::Tensor a = torch::randn({32, 32});
  const std::int64_t f = 2 * 32 * 32 * 32;
  s.counters.step = 1;  // a run resumed inside a window: that window is not counted
  meter.on_step_begin(s, control);
  (void)at::mm(a, a);
  CHECK(meter.flops_per_update() == 0);
  for (std::int64_t step = 2; step < 8; ++step) {
    s.counters.step = step;
    meter.on_step_begin(s, control);
    (void)at::mm(a, a);  // forward
    meter.on_backward_begin(s, control);
    (void)at::mm(a, a);  // backward
    (void)at::mm(a, a);
    meter.on_backward_end(s, control);
    if (step % 2 == 1) meter.on_optimizer_step_end(s, StepResult{}, control);
  }
  CHECK(meter.flops_per_update() == 2 * 3 * f);
  const nlohmann::json j = meter.to_json();
  CHECK(j.at("forward_flops") == 2 * f);
  CHECK(j.at("backward_flops") == 4 * f);
  CHECK(j.at("counted_at_step") == 3);
  CHECK(j.at("timed_updates") == 2);
  CHECK(j.at("mfu").get<double>() > 0);
  CHECK(meter.describe().find("MFU") != std::string::npos);
}

}  // namespace refit_test_step_flops
