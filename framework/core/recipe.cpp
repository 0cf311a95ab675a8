#include "core/recipe.h"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace refit {

const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16_mixed: return "bf16-mixed";
    case Precision::fp16_mixed: return "fp16-mixed";
    case Precision::bf16_true: return "bf16-true";
  }
  return "?";
}

c10::ScalarType parse_dtype_name(const std::string& s, bool* ok) {
  *ok = true;
  if (s == "float32" || s == "fp32") return c10::kFloat;
  if (s == "bfloat16" || s == "bf16") return c10::kBFloat16;
  if (s == "float16" || s == "fp16") return c10::kHalf;
  *ok = false;
  return c10::kFloat;
}

const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kBFloat16: return "bfloat16";
    case c10::kHalf: return "float16";
    case c10::kDouble: return "float64";
    case c10::kLong: return "int64";
    default: return c10::toString(t);
  }
}

std::map<std::string, bool> weight_decay_exemptions(const Recipe& recipe) {
  std::map<std::string, bool> out;
  for (const auto& m : recipe.models) {
    if (m.exempt_1d_and_bias) out[m.spec.name] = *m.exempt_1d_and_bias;
    for (std::size_t j = 0; j < m.rule_exempt_1d_and_bias.size() && j < m.spec.rules.size(); ++j) {
      const std::string& group = m.spec.rules[j].group;
      if (group.empty()) continue;
      if (m.rule_exempt_1d_and_bias[j]) out[group] = *m.rule_exempt_1d_and_bias[j];
      else if (m.exempt_1d_and_bias && !out.count(group))
        out[group] = *m.exempt_1d_and_bias;
    }
  }
  return out;
}

}  // namespace refit
