// The fuzz objects' precompiled header (tests/fuzz/fuzz_targets.cmake): the LibTorch and JSON
// headers that the sources reading LibTorch tensors include through refit's headers.
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/types.h>
