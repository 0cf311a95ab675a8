# LibTorch for a machine without the CUDA toolkit.
#
# The pinned PyPI wheel is LibTorch's CUDA build, and its TorchConfig.cmake enables the CUDA
# language and looks for the toolkit's nvcc and libraries even for a CPU-only consumer: on a
# machine without the toolkit, find_package(Torch) stops with "Your installed Caffe2 version uses
# CUDA but I cannot find the CUDA libraries". refit compiles no CUDA code. Its units include
# CUDA runtime headers only through ATen's CUDA headers (CUDA graphs, streams), and the wheel's
# own CUDA runtime package (nvidia/cu13) ships those headers and libcudart (the crt/ and CCCL
# headers they include come from nvidia-cuda-crt and nvidia-cuda-cccl, which scripts/setup.sh
# adds). So without the
# toolkit, refit imports the wheel's libraries itself, with the compile definitions
# TorchConfig.cmake gives them (LibTorch 2.11; tests/CMakeLists.txt's "cmake: ..." test compares
# the two on a machine that has the toolkit, so an upgrade that changes them is noticed).
#
# Defines the targets find_package(Torch) defines and refit uses (torch, torch_cpu_library,
# torch_cuda) and
# TORCH_INSTALL_PREFIX. Used by refit's build and by the installed SDK's refitConfig.cmake.
include_guard(GLOBAL)

set(_refit_torch_root "")
if(Torch_DIR AND EXISTS "${Torch_DIR}/../../../include/ATen/ATen.h")  # torch/share/cmake/Torch
  get_filename_component(_refit_torch_root "${Torch_DIR}/../../.." ABSOLUTE)
endif()
foreach(prefix ${CMAKE_PREFIX_PATH})
  if(_refit_torch_root)
    break()
  endif()
  if(EXISTS "${prefix}/../../include/ATen/ATen.h")
    get_filename_component(_refit_torch_root "${prefix}/../.." ABSOLUTE)
    break()
  endif()
endforeach()
if(NOT _refit_torch_root)
  message(FATAL_ERROR "LibTorch not found on CMAKE_PREFIX_PATH (${CMAKE_PREFIX_PATH}): run scripts/setup.sh")
endif()
set(TORCH_INSTALL_PREFIX "${_refit_torch_root}")
set(_refit_torch_lib "${_refit_torch_root}/lib")
# The CUDA runtime package beside torch in site-packages (nvidia-cuda-runtime for CUDA 13).
get_filename_component(_refit_cuda_runtime "${_refit_torch_root}/../nvidia/cu13" ABSOLUTE)
find_library(REFIT_WHEEL_CUDART NAMES libcudart.so.13 cudart PATHS "${_refit_cuda_runtime}/lib" NO_DEFAULT_PATH)
if(NOT EXISTS "${_refit_cuda_runtime}/include/cuda_runtime_api.h" OR NOT EXISTS "${_refit_cuda_runtime}/include/crt/host_config.h"
   OR NOT EXISTS "${_refit_cuda_runtime}/include/nv/target" OR NOT REFIT_WHEEL_CUDART)
  message(FATAL_ERROR "No CUDA toolkit, and the torch wheel's CUDA runtime package is incomplete "
                      "(${_refit_cuda_runtime}): run scripts/setup.sh")
endif()

function(_refit_import_torch_library name file)
  add_library(${name} SHARED IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES IMPORTED_LOCATION "${_refit_torch_lib}/${file}"
    INTERFACE_INCLUDE_DIRECTORIES "${_refit_torch_root}/include")
endfunction()
_refit_import_torch_library(c10 libc10.so)
_refit_import_torch_library(c10_cuda libc10_cuda.so)
_refit_import_torch_library(torch_cpu libtorch_cpu.so)
_refit_import_torch_library(torch_cuda libtorch_cuda.so)
_refit_import_torch_library(torch libtorch.so)
set_property(TARGET c10_cuda APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_refit_cuda_runtime}/include")
set_property(TARGET c10_cuda PROPERTY INTERFACE_LINK_LIBRARIES c10 "${REFIT_WHEEL_CUDART}")
set_property(TARGET torch_cpu PROPERTY INTERFACE_COMPILE_DEFINITIONS USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE)
set_property(TARGET torch_cpu PROPERTY INTERFACE_LINK_LIBRARIES c10)
set_property(TARGET torch_cuda PROPERTY INTERFACE_COMPILE_DEFINITIONS USE_NVSHMEM USE_C10D_NCCL)
set_property(TARGET torch_cuda PROPERTY INTERFACE_LINK_LIBRARIES c10_cuda torch_cpu)
# As TorchConfig.cmake: libtorch_cpu and libtorch_cuda linked even where no symbol is used, so
# their operator registrations run.
set_property(TARGET torch PROPERTY INTERFACE_INCLUDE_DIRECTORIES
  "${_refit_torch_root}/include" "${_refit_torch_root}/include/torch/csrc/api/include")
set_property(TARGET torch PROPERTY INTERFACE_LINK_LIBRARIES
  "-Wl,--no-as-needed,${_refit_torch_lib}/libtorch_cpu.so,${_refit_torch_lib}/libtorch_cuda.so -Wl,--as-needed"
  torch_cpu torch_cuda)
# LibTorch's CPU half as TorchConfig.cmake's torch_cpu_library: what refit links.
add_library(torch_cpu_library INTERFACE IMPORTED GLOBAL)
set_target_properties(torch_cpu_library PROPERTIES
  INTERFACE_COMPILE_DEFINITIONS "$<TARGET_PROPERTY:torch_cpu,INTERFACE_COMPILE_DEFINITIONS>"
  INTERFACE_INCLUDE_DIRECTORIES "$<TARGET_PROPERTY:torch_cpu,INTERFACE_INCLUDE_DIRECTORIES>"
  INTERFACE_LINK_LIBRARIES "-Wl,--no-as-needed,${_refit_torch_lib}/libtorch_cpu.so -Wl,--as-needed;torch_cpu")
set(TORCH_LIBRARIES torch)
message(STATUS "refit: no CUDA toolkit: LibTorch imported from ${_refit_torch_root} (CPU builds; "
               "the CUDA runtime headers of ${_refit_cuda_runtime})")
