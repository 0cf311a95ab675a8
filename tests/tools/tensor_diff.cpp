// tensor_diff A.safetensors B.safetensors [max_relative [prefix]]
// Compares two safetensors files tensor by tensor (with `prefix`, only the tensors whose names
// start with it): the same names, shapes and dtypes, and values
// within `max_relative` (default 0: bit-identical) of each other, where a tensor's difference is
// max|a - b| / max(max|b|, 1e-30). Prints the largest difference and the tensor it is in; exits
// 1 when a tensor is missing, differs in shape or dtype, or exceeds the bound.
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string>

#include <ATen/ATen.h>

#include "io/safetensors.h"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: tensor_diff A.safetensors B.safetensors [max_relative [prefix]]\n");
    return 2;
  }
  const double bound = argc >= 4 ? std::strtod(argv[3], nullptr) : 0.0;
  const std::string prefix = argc == 5 ? argv[4] : "";
  try {
    auto only_prefixed = [&](std::map<std::string, at::Tensor> all) {
      for (auto it = all.begin(); it != all.end();) it = it->first.rfind(prefix, 0) == 0 ? std::next(it) : all.erase(it);
      return all;
    };
    auto a = only_prefixed(refit::io::SafetensorsFile::open(argv[1]).load_all());
    auto b = only_prefixed(refit::io::SafetensorsFile::open(argv[2]).load_all());
    if (a.empty()) {
      std::printf("no tensor named %s* in %s\n", prefix.c_str(), argv[1]);
      return 1;
    }
    bool ok = a.size() == b.size();
    if (!ok) std::printf("different tensor counts: %zu and %zu\n", a.size(), b.size());
    double worst = 0;
    std::string worst_name;
    for (const auto& [name, ta] : a) {
      auto it = b.find(name);
      if (it == b.end()) {
        std::printf("%s: only in %s\n", name.c_str(), argv[1]);
        ok = false;
        continue;
      }
      const auto& tb = it->second;
      if (ta.sizes() != tb.sizes() || ta.scalar_type() != tb.scalar_type()) {
        std::printf("%s: shape or dtype differs\n", name.c_str());
        ok = false;
        continue;
      }
      if (!ta.is_floating_point()) {
        if (!at::equal(ta, tb)) std::printf("%s: integer values differ\n", name.c_str()), ok = false;
        continue;
      }
      auto da = ta.to(at::kDouble), db = tb.to(at::kDouble);
      const double scale = std::max(db.abs().max().item<double>(), 1e-30);
      const double diff = (da - db).abs().max().item<double>() / scale;
      if (!(diff <= worst) || worst_name.empty()) worst = diff, worst_name = name;
    }
    std::printf("largest relative difference: %.3e (%s) over %zu tensors; bound %.1e\n", worst, worst_name.c_str(), a.size(),
                bound);
    if (!(worst <= bound)) ok = false;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensor_diff: %s\n", e.what());
    return 1;
  }
}
