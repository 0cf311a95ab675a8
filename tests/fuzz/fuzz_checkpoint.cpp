// libFuzzer target: the checkpoint reader (load_checkpoint: state.safetensors' counters, metric,
// resume fingerprint, component list, buffers, in-window gradients; trainable.safetensors' base
// fingerprint, names and shapes; then each component's load_state_dict: optimizer, gradient
// scaler, RNG), as a resumed run calls it.
// The run it resumes into is built at startup: a frozen model "base" (Linear 8 -> 8 and a
// BatchNorm1d, whose running statistics are buffers) and a trainable model "head" (Linear 8 -> 3),
// AdamW after one step, a gradient scaler and the RNG, resume fingerprint {"/training/seed": "5"},
// 100 steps at most. Its own checkpoint (step 3, inside an accumulation window: gradients saved)
// is the seed: with FUZZ_SEED_DIR set, LLVMFuzzerInitialize writes it there.
// Input: a 4-byte little-endian length N, N bytes of state.safetensors, then trainable.safetensors.
// Both files are written to a folder of this process and read from there (the reader opens files).
// Clean refusals: refit::Error; anything else that escapes, a crash or an ASan report is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <ATen/Parallel.h>
#include <torch/nn/modules/batchnorm.h>

#include "io/remove_tree.h"
#include "precision/grad_scaler.h"
#include "refit/error.h"
#include "refit/layers.h"
#include "refit/model.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/rng.h"

namespace fs = std::filesystem;
using namespace refit;

namespace {

class Base : public TensorModel {
 public:
  Base() {
    proj = register_module("proj", std::make_shared<nn::Linear>(8, 8));
    norm = register_module("norm", torch::nn::BatchNorm1d(8));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return norm->forward(proj->forward(x)); }
  std::shared_ptr<nn::Linear> proj;
  torch::nn::BatchNorm1d norm{nullptr};
};

class Head : public TensorModel {
 public:
  Head() { proj = register_module("proj", std::make_shared<nn::Linear>(8, 3)); }
  torch::Tensor forward(const torch::Tensor& x) override { return proj->forward(x); }
  std::shared_ptr<nn::Linear> proj;
};

struct Run {
  ModelRegistry models{Precision::fp32};
  std::unique_ptr<Optimizer> optimizer;
  GradScaler scaler{GradScalerOptions{}, torch::kCPU};
  RngState rng;
  StateComponents components() { return {{"optimizer", optimizer.get()}, {"scaler", &scaler}, {"rng", &rng}}; }
  const ResumeFingerprint fingerprint{{"/training/seed", "5"}};
  fs::path dir;
};

Run* run;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write(const fs::path& p, const std::uint8_t* data, std::size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  torch::manual_seed(5);
  run = new Run;
  ModelSpec base;
  base.name = "base";
  run->models.add(std::make_shared<Base>(), base, torch::kCPU);
  ModelSpec head;
  head.name = "head";
  head.trainable = true;
  run->models.add(std::make_shared<Head>(), head, torch::kCPU);
  OptimizerSpec spec;
  run->optimizer = std::make_unique<Optimizer>(spec, run->models.parameter_groups(spec));
  for (const auto& m : run->models.models())
    for (const auto& p : m.parameters)
      if (p.trainable) p.tensor.mutable_grad() = torch::ones_like(p.tensor);
  run->optimizer->step();
  run->dir = fs::temp_directory_path() / ("refit-fuzz-checkpoint-" + std::to_string(::getpid()));
  io::remove_tree(run->dir);
  fs::create_directories(run->dir / "step");
  if (const char* seeds = std::getenv("FUZZ_SEED_DIR")) {
    CheckpointState s;
    s.counters = {3, 3, 1, 24, 0};
    s.metric = 0.5;
    s.in_window = true;
    s.fingerprint = run->fingerprint;
    const fs::path saved =
        save_checkpoint(run->dir / "seed", run->models, base_fingerprint(run->models), run->components(), s);
    const std::string state = read(saved / "state.safetensors"), trainable = read(saved / "trainable.safetensors");
    std::string seed(4, '\0');
    for (int i = 0; i < 4; ++i) seed[i] = static_cast<char>((state.size() >> (8 * i)) & 0xff);
    seed += state + trainable;
    std::ofstream(fs::path(seeds) / "seed-step-3", std::ios::binary) << seed;
    io::remove_tree(run->dir / "seed");
  }
  std::atexit([] { io::remove_tree(run->dir); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::size_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<std::size_t>(data[i]) << (8 * i);
  n = std::min(n, size - 4);
  write(run->dir / "step" / "state.safetensors", data + 4, n);
  write(run->dir / "step" / "trainable.safetensors", data + 4 + n, size - 4 - n);
  try {
    (void)load_checkpoint(run->dir / "step", run->models, run->components(), run->fingerprint, {}, 100);
  } catch (const Error&) {
  }
  return 0;
}
