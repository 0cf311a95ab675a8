#include "train/rng.h"

#include <mutex>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <torch/cuda.h>

#include "refit/error.h"

namespace refit {

namespace {
std::vector<c10::Device> devices() {
  std::vector<c10::Device> d{c10::Device(c10::kCPU)};
  for (c10::DeviceIndex i = 0; i < static_cast<c10::DeviceIndex>(torch::cuda::device_count()); ++i)
    d.emplace_back(c10::kCUDA, i);
  return d;
}
}  // namespace

std::map<std::string, torch::Tensor> capture_rng() {
  std::map<std::string, torch::Tensor> out;
  for (const auto& d : devices()) {
    at::Generator gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    out[d.str()] = gen.get_state();
  }
  return out;
}

void restore_rng(const std::map<std::string, torch::Tensor>& states) {
  // Each state is tried on a copy of its generator first: LibTorch's set_state() refuses a
  // damaged one (size, dtype, an invalid mt19937 state) with a c10::Error, which would leave the
  // generators restored before it changed and say nothing of where the state came from.
  std::vector<std::pair<at::Generator, torch::Tensor>> restore;
  for (const auto& d : devices()) {
    auto it = states.find(d.str());
    if (it == states.end()) continue;
    at::Generator gen = at::globalContext().defaultGenerator(d);
    at::Generator probe;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      probe = gen.clone();
    }
    try {
      probe.set_state(it->second);
    } catch (const c10::Error& e) {
      throw Error("the RNG state of " + d.str() + " is not one LibTorch can restore (" + e.what_without_backtrace() +
                  "; a damaged checkpoint?)");
    }
    restore.emplace_back(gen, it->second);
  }
  for (auto& [gen, state] : restore) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
}

void seed_all(std::uint64_t seed) {
  for (const auto& d : devices()) {
    at::Generator gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
}

}  // namespace refit
