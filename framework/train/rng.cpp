#include "train/rng.h"

#include <mutex>

#include <ATen/Context.h>
#include <torch/cuda.h>

namespace refit {

namespace {
std::vector<c10::Device> devices() {
  std::vector<c10::Device> d{c10::Device(c10::kCPU)};
  for (std::size_t i = 0; i < torch::cuda::device_count(); ++i) d.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
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
  for (const auto& d : devices()) {
    auto it = states.find(d.str());
    if (it == states.end()) continue;
    at::Generator gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(it->second);
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
