#include "run/run_environment.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <ATen/Parallel.h>

#include "cuda/cuda_support.h"
#include "core/plugin_loader.h"
#include "memory/process_malloc.h"
#include "precision/bf16_products.h"
#include "refit/version.h"

namespace refit {

namespace {

/// The value after "key:" on the first line of `file` that starts with `key`, trimmed; "" if none.
std::string field(const std::filesystem::path& file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r") + 1);
    return value;
  }
  return "";
}

/// The model name of the NVIDIA GPU the driver lists first (/proc/driver/nvidia), or "".
std::string gpu_model() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    std::string model = field(e.path() / "information", "Model");
    if (!model.empty()) return model;
  }
  return "";
}

}  // namespace

std::string device_model(const c10::Device& device) {
  return device.is_cuda() ? gpu_model() : field("/proc/cpuinfo", "model name");
}

int parallel_loop_threads() {
  std::mutex mutex;
  std::set<std::thread::id> seen;
  // One iteration per thread: ATen gives each thread one chunk of divup(n, threads) iterations
  // (no stealing), so every thread gets exactly one and records itself.
  at::parallel_for(0, at::get_num_threads(), 1, [&](std::int64_t, std::int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    seen.insert(std::this_thread::get_id());
  });
  return static_cast<int>(seen.size());
}

nlohmann::json run_environment(const c10::Device& device, const std::string& precision, bool grad_scaler,
                               const std::vector<std::string>& param_groups) {
  nlohmann::json e;
  e["refit"] = kVersion;
  e["plugin_api"] = kPluginApiVersion;
  e["libtorch"] = host_torch_version();
  e["cuda_support"] = cuda::support_status();
  if (const std::string cudart = cuda::cudart_version(); !cudart.empty()) e["cuda_runtime"] = cudart;
  e["device"] = device.str();
  const std::string model = device_model(device);
  if (!model.empty()) e["device_model"] = model;
  e["cpu_threads"] = at::get_num_threads();
  e["parallel_loop_threads"] = parallel_loop_threads();
  // A CPU run's only (describing it times a matmul on one thread, once: at the run's start there).
  if (device.is_cpu()) e["cpu_bf16_products"] = precision::configure_bf16_products().describe();
  e["precision"] = precision;
  e["grad_scaler"] = grad_scaler;
  e["malloc"] = process_malloc();
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) e["host"] = host;
  e["param_groups"] = param_groups;
  return e;
}

}  // namespace refit
