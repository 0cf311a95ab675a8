// GPU tests (ctest label "gpu"): skipped (exit code 77, reported by ctest as "Skipped") when no
// CUDA device is present; on the GPU machine: `ctest -L gpu` (../shared/device/gpu-check.sh).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <torch/cuda.h>

#include "core/recipe.h"
#include "precision/grad_scaler.h"
#include "run/session.h"
#include "train/optimizer.h"

using namespace refit;

TEST_CASE("a recipe trains on CUDA under bf16-mixed with pinned, prefetched batches") {
  Recipe r = load_recipe(std::string(std::getenv("REFIT_SOURCE_DIR")) + "/recipes/frozen-bf16-probe.json",
                         {"training.device=cuda", "training.duration=20:step", "output.checkpoints.enabled=false",
                          "output.dir=" + (std::filesystem::temp_directory_path() / "refit-gpu-test").string()});
  Session session(std::move(r));
  std::FILE* devnull = std::fopen("/dev/null", "w");
  auto summary = session.train(devnull);
  std::fclose(devnull);
  CHECK(summary.counters.step == 20);
  CHECK(summary.counters.skipped_iterations == 0);
  REQUIRE(summary.last_eval);
  CHECK(std::isfinite(summary.last_eval->metrics.at("loss")));
}

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
  auto p_cpu = torch::randn({4, 3}).requires_grad_(true);
  auto p_gpu = p_cpu.detach().cuda().requires_grad_(true);
  OptimizerSpec spec;
  ParameterGroup gc{"g", {p_cpu}, 1e-2, 0.05, 1e-8, {0.9, 0.999}}, gg{"g", {p_gpu}, 1e-2, 0.05, 1e-8, {0.9, 0.999}};
  Optimizer oc(spec, {gc}), og(spec, {gg});
  for (int i = 0; i < 5; ++i) {
    auto grad = torch::randn({4, 3});
    p_cpu.mutable_grad() = grad;
    p_gpu.mutable_grad() = grad.cuda();
    oc.step();
    og.step();
  }
  CHECK(torch::allclose(p_cpu, p_gpu.cpu(), 1e-5, 1e-6));
}

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
