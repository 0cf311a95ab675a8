#pragma once
// What a run ran on, recorded in summary.json's "environment" (the run report shows it):
// refit and plugin API versions, LibTorch, the CUDA runtime, the device (and its model where the
// system names it), CPU threads, precision, the grad scaler, malloc, host, the optimizer's groups.
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

namespace refit {

/// The GPU's model as the NVIDIA driver names it, or the CPU's (/proc/cpuinfo); "" if unknown.
std::string device_model(const c10::Device& device);

/// How many threads an at::parallel_for loop in refit's own code runs on (distinct threads over
/// one iteration per intra-op thread): the intra-op thread count when refit was compiled with
/// OpenMP (CMakeLists.txt), 1 otherwise. Recorded as "parallel_loop_threads".
int parallel_loop_threads();

nlohmann::json run_environment(const c10::Device& device, const std::string& precision, bool grad_scaler,
                               const std::vector<std::string>& param_groups);

}  // namespace refit
