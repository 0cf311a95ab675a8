#pragma once
// Shared by the benchmarks that drive refit's Trainer directly.
#include <chrono>
#include <cstdint>

#include <cstdlib>
#include <string>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include "cli/commands/train.h"
#include "memory/device_memory.h"
#include "memory/host_allocator.h"
#include "precision/bf16_products.h"
#include "memory/process_malloc.h"
#include "refit/callback.h"
#include "refit/dataset.h"

namespace refit::bench {

/// One fixed batch, repeated every step (the Python peers reuse one x, y). Kept wherever x and y
/// are: on the device, each step collates it there with no host copy.
inline Batch batch_of(const std::string& field, torch::Tensor x, torch::Tensor y) {
  Batch b{{field, x}, {"labels", std::move(y)}};
  b.samples = x.size(0);
  return b;
}

class FixedBatch : public Dataset {
 public:
  /// `field`: the name the model reads x as ("features" for an MLP, "pixel_values" for a ViT).
  FixedBatch(torch::Tensor x, torch::Tensor y, std::string field = "features")
      : x_(std::move(x)), y_(std::move(y)), field_(std::move(field)) {}
  std::vector<FieldInfo> fields() const override { return {{field_}, {"labels"}}; }
  std::int64_t size() const override { return x_.size(0); }
  Example get(std::int64_t i) const override { return Example{{field_, x_[i]}, {"labels", y_[i]}}; }
  /// The whole set in order is the tensors themselves (the peers reuse x and y as they are).
  std::optional<Batch> sample_batch(const std::vector<std::int64_t>& indices, std::int64_t) const override {
    bool in_order = static_cast<std::int64_t>(indices.size()) == size();
    for (std::size_t i = 0; in_order && i < indices.size(); ++i) in_order = indices[i] == static_cast<std::int64_t>(i);
    if (in_order) return batch_of(field_, x_, y_);
    auto idx = torch::tensor(indices, torch::kLong).to(x_.device());
    return batch_of(field_, x_.index_select(0, idx), y_.index_select(0, idx));
  }

 private:
  torch::Tensor x_, y_;
  std::string field_;
};

/// Times the steps after `warmup` up to the end of training (synchronising the device at both
/// ends; ms_per_step() after the run) and, on CUDA, resets
/// the allocator's peak statistics when the timing starts. Keeps the last step's loss.
/// With REFIT_BENCH_TRACE=file.json the timed steps are also recorded by PyTorch's profiler
/// (Chrome trace; `python bench/trace_summary.py file.json` tabulates it like key_averages()).
/// REFIT_BENCH_GRAPH=1: the benchmark turns /training/cuda_graph on (and reports the plan).
inline bool graph_requested() {
  const char* g = std::getenv("REFIT_BENCH_GRAPH");
  return g && std::string(g) == "1";
}

/// The CPU allocator `refit train` runs with: the caching host allocator, unless
/// REFIT_BENCH_HOST_CACHE=0 (the system allocator, as `refit train --host-cache-mib 0`).
/// Returns whether it is installed.
/// As `refit` does first: bf16 products through fp32 kernels where this CPU has no fast bf16
/// (precision/bf16_products.h). Returns the decision's description for the result line.
inline std::string configure_bf16_products() { return precision::configure_bf16_products().describe(); }

inline bool use_train_host_allocator() {
  const char* h = std::getenv("REFIT_BENCH_HOST_CACHE");
  if (h && std::string(h) == "0") return false;
  return install_caching_host_allocator();
}

class StepClock : public Callback {
 public:
  StepClock(std::int64_t warmup, torch::Device device) : warmup_(warmup), device_(device) {}
  void on_step_end(const TrainState&, const StepResult& r, TrainerControl&) override {
    last_loss = r.loss;
    if (++steps_ != warmup_) return;
    if (device_.is_cuda()) {
      torch::cuda::synchronize();
      reset_peak_device_memory(device_);
    }
    if (const char* trace = std::getenv("REFIT_BENCH_TRACE")) {
      trace_ = trace;
      namespace prof = torch::profiler::impl;
      std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
      if (device_.is_cuda()) activities.insert(prof::ActivityType::CUDA);
      prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
      torch::autograd::profiler::prepareProfiler(config, activities);
      torch::autograd::profiler::enableProfiler(config, activities);
    }
    start_ = std::chrono::steady_clock::now();
  }
  // The end of the timed steps: the end of training, before anything `refit train` does after it
  // (summary, plot).
  void on_train_end(const TrainState&, TrainerControl&) override {
    if (device_.is_cuda()) torch::cuda::synchronize();
    end_ = std::chrono::steady_clock::now();
  }
  double ms_per_step() {
    auto dt = std::chrono::duration<double, std::milli>(end_ - start_).count();
    if (!trace_.empty()) {
      torch::autograd::profiler::disableProfiler()->save(trace_);
      trace_.clear();
    }
    return dt / static_cast<double>(steps_ - warmup_);
  }
  torch::Tensor last_loss;

 private:
  std::int64_t warmup_, steps_ = 0;
  torch::Device device_;
  std::chrono::steady_clock::time_point start_, end_;
  std::string trace_;
};

/// Trains the assembled recipe through `refit train`'s own code (cli::train) with a StepClock after
/// its callbacks, and prints the one JSON line bench/compare.py reads.
inline void train_and_report(const Assembly& assembly, const std::string& dev, std::int64_t warmup, bool host_cache,
                             const std::string& bf16_products) {
  auto clock = std::make_shared<StepClock>(warmup, torch::Device(dev == "cuda" ? torch::kCUDA : torch::kCPU));
  std::FILE* devnull = std::fopen("/dev/null", "w");
  cli::train(assembly, devnull, {clock});
  std::fclose(devnull);
  std::printf("%s\n", Json{{"impl", "refit-train"},
                           {"device", dev},
                           {"ms_per_step", clock->ms_per_step()},
                           {"host_cache", host_cache},
                           {"malloc", process_malloc()},
                           {"cpu_bf16_products", bf16_products}}
                          .dump()
                          .c_str());
}

}  // namespace refit::bench
