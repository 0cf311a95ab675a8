// GPU tests (ctest label "gpu"): skipped (exit code 77, reported by ctest as "Skipped") when no
// CUDA device is present; on a CUDA machine: `ctest -L gpu`, or bench/gpu_run.sh (sets the machine up,
// builds, runs these tests and the GPU benchmarks).
// c10/util/Logging.h defines a glog-style CHECK macro (abort on failure, not a test assertion);
// included before Catch so that Catch's CHECK is the one every test sees, whatever it includes.
#include <c10/util/Logging.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>

#include "core/plugin_loader.h"
#include "core/recipe_parser.h"
#include "cuda/cuda_support.h"
#include "memory/device_memory.h"
#include "model/model_registry.h"
#include "objectives/classification.h"
#include "precision/grad_scaler.h"
#include "quant/quantized_weight.h"
#include "quant/quantize.h"
#include "refit/layers.h"
#include "../unit/quantized_test_weights.h"
#include "cli/commands/train.h"
#include "run/assembly.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "../unit/catch_session.h"
#include "../unit/graph_support.h"

using namespace refit;

TEST_CASE("refit's CUDA support is loaded where a driver is, and counts the caching allocator's bytes") {
  INFO(cuda::support_status());
  REQUIRE(cuda::runtime() != nullptr);
  const torch::Device device(torch::kCUDA, 0);
  reset_peak_device_memory(device);
  const auto before = device_memory(device);
  REQUIRE(before);
  auto t = torch::empty({1 << 20}, torch::TensorOptions().device(device));
  const auto during = device_memory(device);
  REQUIRE(during);
  CHECK(during->in_use - before->in_use >= (std::int64_t{1} << 22));
  // The reset reached the allocator: the peak started at what was in use, and outlives the free.
  CHECK(before->peak == before->in_use);
  t = torch::Tensor();
  const auto after = device_memory(device);
  REQUIRE(after);
  CHECK(after->in_use < during->in_use);
  CHECK(after->peak >= before->in_use + (std::int64_t{1} << 22));
}

TEST_CASE("a recipe trains on CUDA under bf16-mixed with pinned, prefetched batches") {
  Recipe r = load_recipe(std::string(std::getenv("REFIT_SOURCE_DIR")) + "/recipes/frozen-bf16-probe.json",
                         {"training.device=cuda", "training.duration=20:step", "output.checkpoints.enabled=false",
                          "output.dir=" + (std::filesystem::temp_directory_path() / "refit-gpu-test").string()});
  Assembly assembly(std::move(r));
  std::FILE* devnull = std::fopen("/dev/null", "w");
  auto summary = cli::train(assembly, devnull);
  std::fclose(devnull);
  CHECK(summary.counters.step == 20);
  CHECK(summary.counters.skipped_iterations == 0);
  REQUIRE(summary.last_eval);
  CHECK(std::isfinite(summary.last_eval->metrics.at("loss")));
}

namespace {

/// The same fused AdamW over one parameter on the CPU and on CUDA, fed the same gradients.
struct AdamWPair {
  torch::Tensor p_cpu = torch::randn({4, 3}).requires_grad_(true);
  torch::Tensor p_gpu = p_cpu.detach().cuda().requires_grad_(true);
  Optimizer cpu{OptimizerSpec{}, {ParameterGroup{"g", {p_cpu}, 1e-2, 0.05, 1e-8, {0.9, 0.999}}}};
  Optimizer gpu{OptimizerSpec{}, {ParameterGroup{"g", {p_gpu}, 1e-2, 0.05, 1e-8, {0.9, 0.999}}}};
  void step(const torch::Tensor& grad, const torch::Tensor& found_inf = {}) {
    p_cpu.mutable_grad() = grad;
    p_gpu.mutable_grad() = grad.cuda();
    cpu.step(found_inf);
    gpu.step(found_inf.defined() ? found_inf.cuda() : found_inf);
  }
};

}  // namespace

TEST_CASE("GradScaler and fused AdamW give the CPU results on CUDA") {
  GradScalerOptions o;
  o.growth_interval = 2;
  GradScaler cpu(o, torch::kCPU), gpu(o, torch::kCUDA);
  for (int i = 0; i < 6; ++i) {
    auto g = torch::randn({5}) * 100;
    if (i == 3) g[1] = INFINITY;
    std::vector<torch::Tensor> gc{g * cpu.scale_tensor()}, gg{(g * cpu.scale_tensor()).cuda()};
    cpu.unscale(gc);
    gpu.unscale(gg);
    CHECK(cpu.found_inf().item<float>() == gpu.found_inf().cpu().item<float>());
    cpu.update();
    gpu.update();
    CHECK(cpu.scale_tensor().item<float>() == gpu.scale_tensor().cpu().item<float>());
  }
  AdamWPair adamw;
  for (int i = 0; i < 5; ++i) adamw.step(torch::randn({4, 3}));
  CHECK(torch::allclose(adamw.p_cpu, adamw.p_gpu.cpu(), 1e-5, 1e-6));
}

TEST_CASE("quantized layers on CUDA: an NF4, an int8 and a GGUF Q4_1 Linear compute the dense product of their "
          "dequantized weight (the portable path), forward and backward") {
  for (const std::string format : {"nf4", "int8", "q4_1"}) {
    INFO(format);
    torch::manual_seed(7);
    auto q = std::make_shared<nn::Linear>(256, 96, /*with_bias=*/true);
    torch::manual_seed(7);
    auto dense = std::make_shared<nn::Linear>(256, 96, /*with_bias=*/true);
    const auto w = test::quantized_weight_for(format, q->weight, torch::kFloat);
    q->set_quantized_weight(w);
    {
      torch::NoGradGuard ng;
      dense->weight.copy_(w->dequantize(torch::kFloat));
    }
    const torch::Tensor cpu_dense = w->dequantize(torch::kFloat);
    q->to(torch::kCUDA);  // the packed buffers move with the module
    dense->to(torch::kCUDA);
    // Dequantized on the GPU by LibTorch's ops: the CPU's values, exactly.
    CHECK(torch::equal(w->dequantize(torch::kFloat).cpu(), cpu_dense));
    const torch::Tensor x = torch::randn({3, 5, 256}, torch::kCUDA).requires_grad_(true);
    const torch::Tensor x2 = x.detach().clone().requires_grad_(true);
    const torch::Tensor y = q->forward(x), y2 = dense->forward(x2);
    CHECK(y.device().is_cuda());
    CHECK(torch::equal(y, y2));  // the same at::linear on the same values
    const torch::Tensor g = torch::randn({3, 5, 96}, torch::kCUDA);
    y.backward(g);
    y2.backward(g);
    // g W by matmul against linear's backward: within 2 gamma_96(2^-24) max |g| |W| (TF32 off).
    const double bound = 2 * 96 * std::ldexp(1.0, -24) / (1 - 96 * std::ldexp(1.0, -24)) *
                         g.abs().matmul(dense->weight.detach().abs()).max().item<double>();
    CHECK((x.grad() - x2.grad()).abs().max().item<double>() <= bound);
  }
}

namespace {

/// Turns CUDA's sync debug mode to "error" from on_step_begin to on_step_end (the last callback),
/// except on the last step (the final progress line reads the loss): any host synchronisation
/// inside the step (item(), a blocking copy, a stream/device synchronise) throws.
class NoSyncInStep : public Callback {
 public:
  std::int64_t steps_checked = 0;
  void on_step_begin(const TrainState& s, TrainerControl&) override {
    if (s.counters.step + 1 < s.max_steps) c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  void on_step_end(const TrainState& s, const StepResult&, TrainerControl&) override {
    if (c10::cuda::warning_state().get_sync_debug_mode() == c10::cuda::SyncDebugMode::L_ERROR) ++steps_checked;
    off();
  }
  void on_train_end(const TrainState&, TrainerControl&) override { off(); }
  /// The mode is process-wide: a step that throws must not leave it on for the next tests.
  static void off() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED); }
};

/// Fashion-MNIST on the GPU machine: the carried Debian package is unpacked under /tmp/deps.
std::string fashion_mnist_root() {
  for (const char* dir : {"/usr/share/datasets/fashion-mnist", "/tmp/deps/usr/share/datasets/fashion-mnist"})
    if (std::filesystem::is_directory(dir)) return dir;
  return "";
}

}  // namespace

TEST_CASE("no host synchronisation inside the step on CUDA (fp16-mixed scaler, clipping, EMA, fused AdamW)") {
  for (const char* precision : {"fp16-mixed", "bf16-mixed"}) {
    INFO(precision);
    Json doc{{"plugins", {{"load", {"vision", "datasets"}}}},
             {"models",
              {{{"name", "net"},
                {"type", "mlp"},
                {"config", {{"in_features", 16}, {"hidden", {32}}, {"out_features", 4}}},
                {"trainable", true}},
               {{"name", "net_ema"}, {"ema", {{"of", "net"}}}}}},
             {"data", {{"train", {{"type", "synthetic"}, {"config", {{"num_samples", 256}, {"num_features", 16}}}}}}},
             {"objective", {{"type", "classification"}, {"config", {{"models", {"net"}}}}}},
             {"training",
              {{"duration", "12:step"},
               {"batch_size", 8},
               {"gradient_accumulation", 2},
               {"precision", precision},
               {"device", "cuda"},
               {"clip_grad_norm", 1.0},
               {"log_every", 1000},
               {"num_workers", 0}}},
             {"output",
              {{"dir", (std::filesystem::temp_directory_path() / "refit-gpu-sync").string()},
               {"checkpoints", {{"enabled", false}}}}}};
    auto guard = std::make_shared<NoSyncInStep>();
    std::FILE* devnull = std::fopen("/dev/null", "w");
    try {
      cli::train(Assembly(parse_recipe(doc, "/tmp")), devnull, {guard});
    } catch (...) {
      NoSyncInStep::off();
      std::fclose(devnull);
      throw;
    }
    std::fclose(devnull);
    CHECK(guard->steps_checked == 11);
  }
}

TEST_CASE("fused AdamW with found_inf skips on the device like the CPU kernel") {
  AdamWPair adamw;
  for (int i = 0; i < 5; ++i) adamw.step(torch::randn({4, 3}), torch::full({1}, i == 2 ? 1.0f : 0.0f));
  CHECK(torch::allclose(adamw.p_cpu, adamw.p_gpu.cpu(), 1e-5, 1e-6));
  CHECK(adamw.cpu.state_dict().at("group0.param0.step").item<double>() == 4);
  CHECK(adamw.gpu.state_dict().at("group0.param0.step").item<double>() == 4);
}

TEST_CASE("the DINO recipe trains on CUDA (short)") {
  const std::string root = fashion_mnist_root();
  if (root.empty()) {
    FAIL("Fashion-MNIST not found: carry Debian's dataset-fashion-mnist (the prepare line in docs/performance.md)");
  }
  Recipe r = load_recipe(std::string(std::getenv("REFIT_SOURCE_DIR")) + "/recipes/fashion-mnist/dino-bf16.json",
                         {"training.device=cuda", "training.duration=10:step", "output.checkpoints.enabled=false",
                          "data.train.config.root=" + root, "data.sets.knn_bank.config.root=" + root,
                          "data.sets.knn_queries.config.root=" + root, "data.sets.knn_bank.config.limit=300",
                          "data.sets.knn_queries.config.limit=300",
                          "output.dir=" + (std::filesystem::temp_directory_path() / "refit-gpu-dino").string()});
  std::FILE* devnull = std::fopen("/dev/null", "w");
  auto summary = cli::train(Assembly(std::move(r)), devnull);
  std::fclose(devnull);
  REQUIRE(summary.last_eval);
  CHECK(summary.last_eval->metrics.at("knn_accuracy") > 0.3);
}

namespace {
/// test::expect_as_eager with real CUDA graphs.
template <class... Args>
test::Outcome as_eager(const std::string& plan, Args&&... args) {
  return test::expect_as_eager(torch::kCUDA, false, plan, std::forward<Args>(args)...);
}
}  // namespace

// The cases of tests/unit/test_step_graph.cpp (emulated there), with real captures.
TEST_CASE("cuda_graph: replayed steps train exactly as eager steps (bf16-mixed, LoRA, clipping, cosine lr)") {
  as_eager("on: step 3 captured; 12 replays, 3 eager steps", "bf16-mixed", 3, 1000, -1);
}

TEST_CASE("cuda_graph: a batch of another shape runs eagerly, the graph resumes after it") {
  as_eager("on: step 3 captured; 4 replays, 11 eager steps", "bf16-mixed", 3, 16, -1);
}

TEST_CASE("cuda_graph: accumulation windows replay two graphs (accumulate, update) like eager steps") {
  as_eager("on: step 3 and 5 captured; 10 replays, 4 eager steps", "bf16-mixed", 3, 1000, -1, 3);
}

TEST_CASE("cuda_graph: the run's first update captured (warm-up 1 < k 3) finds its optimizer state") {
  // Optimizer state created inside the capture would be re-zeroed by every replay.
  as_eager("on: step 1 and 2 captured; 12 replays, 2 eager steps", "bf16-mixed", 1, 1000, -1, 3);
}

TEST_CASE("cuda_graph: a step failing inside the capture is closed cleanly and the run goes on eagerly") {
  // The objective raises at the capture (call 3), before launching anything: CUDA closes the
  // capture, the loop drops the graph and continues eagerly with the eager run's results.
  as_eager("off: the capture at step 3 failed (this forward cannot run in a graph)", "bf16-mixed", 3, 1000, -1, 1,
           test::failing_at(3));
}

TEST_CASE("cuda_graph: fp16-mixed, a NaN batch is skipped on the device in eager and replayed steps") {
  // Sample 9 is in step 2 (eager, before the capture) and step 10 (a replay).
  auto graphed = as_eager("on: step 3 captured; 12 replays, 3 eager steps", "fp16-mixed", 3, 1000, 9);
  CHECK(graphed.skipped_iterations == 2);
  CHECK(graphed.skipped.at(2));
  CHECK(graphed.skipped.at(10));
}

TEST_CASE("the DINO recipe trains on CUDA with its step replayed from CUDA graphs (short)") {
  const std::string root = fashion_mnist_root();
  if (root.empty()) {
    FAIL("Fashion-MNIST not found: carry Debian's dataset-fashion-mnist (the prepare line in docs/performance.md)");
  }
  const auto out = std::filesystem::temp_directory_path() / "refit-gpu-dino-graph";
  Recipe r = load_recipe(std::string(std::getenv("REFIT_SOURCE_DIR")) + "/recipes/fashion-mnist/dino-bf16.json",
                         {"training.device=cuda", "training.duration=24:step", "training.cuda_graph=true",
                          "output.checkpoints.enabled=false", "data.train.config.root=" + root,
                          "data.sets.knn_bank.config.root=" + root, "data.sets.knn_queries.config.root=" + root,
                          "data.sets.knn_bank.config.limit=300", "data.sets.knn_queries.config.limit=300",
                          "output.dir=" + out.string()});
  std::FILE* devnull = std::fopen("/dev/null", "w");
  auto summary = cli::train(Assembly(std::move(r)), devnull);
  std::fclose(devnull);
  REQUIRE(summary.last_eval);
  CHECK(summary.last_eval->metrics.at("knn_accuracy") > 0.3);
  auto written = Json::parse(std::ifstream(out / "summary.json"));
  CHECK_THAT(written.at("cuda_graph").get<std::string>(), Catch::StartsWith("on: step"));
}

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
  return refit_test::run_catch_session(argc, argv);
}

TEST_CASE("gradient checkpointing on CUDA: the quickstart trains with less activation memory") {
  // bf16-mixed on CUDA, LoRA in the frozen bf16 ViT: the caching allocator's statistics give the
  // activation peaks with and without recomputation (docs/performance.md records them).
  auto run = [](bool checkpointing) {
    const auto dir = std::filesystem::temp_directory_path() / (checkpointing ? "refit-gpu-ckpt-on" : "refit-gpu-ckpt-off");
    Recipe r = load_recipe(std::string(std::getenv("REFIT_SOURCE_DIR")) + "/recipes/quickstart.json",
                           {"training.device=cuda", "training.duration=10:step", "training.batch_size=256",
                            "training.gradient_accumulation=1",
                            "models.0.gradient_checkpointing=" + std::string(checkpointing ? "true" : "false"),
                            "output.dir=" + dir.string()});
    Assembly assembly(std::move(r));
    std::FILE* devnull = std::fopen("/dev/null", "w");
    cli::train(assembly, devnull);
    std::fclose(devnull);
    nlohmann::json summary;
    std::ifstream(dir / "summary.json") >> summary;
    return summary;
  };
  const auto off = run(false), on = run(true);
  const double a_off = off["memory"]["measured"]["activations"].get<double>();
  const double a_on = on["memory"]["measured"]["activations"].get<double>();
  std::printf("quickstart on CUDA, batch 256: activations %.1f MiB without, %.1f MiB with checkpointing\n",
              a_off / (1 << 20), a_on / (1 << 20));
  CHECK(a_on < 0.6 * a_off);
}
