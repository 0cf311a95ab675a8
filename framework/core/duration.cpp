#include "core/duration.h"

#include <cctype>

namespace refit {

const char* to_string(TimeUnit u) {
  switch (u) {
    case TimeUnit::step: return "step";
    case TimeUnit::iteration: return "iteration";
    case TimeUnit::epoch: return "epoch";
  }
  return "?";
}

std::string Duration::to_string() const { return std::to_string(count) + ":" + refit::to_string(unit); }

std::optional<Duration> parse_duration(const std::string& text) {
  auto colon = text.find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  std::string number = text.substr(0, colon), unit = text.substr(colon + 1);
  for (char c : number)
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  if (number.size() > 15) return std::nullopt;
  Duration d;
  d.count = std::stoll(number);
  if (d.count <= 0) return std::nullopt;
  if (unit == "step") d.unit = TimeUnit::step;
  else if (unit == "iteration")
    d.unit = TimeUnit::iteration;
  else if (unit == "epoch")
    d.unit = TimeUnit::epoch;
  else
    return std::nullopt;
  return d;
}

std::string duration_expectation(const std::string& got) {
  return "expected \"N:step|iteration|epoch\" with N > 0, got \"" + got + "\"";
}

}  // namespace refit
