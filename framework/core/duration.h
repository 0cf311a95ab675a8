#pragma once
// Durations and intervals of the training clock: "N:step" (micro-batches), "N:iteration"
// (optimizer updates), "N:epoch".
#include <cstdint>
#include <optional>
#include <string>

namespace refit {

enum class TimeUnit { step, iteration, epoch };

struct Duration {
  std::int64_t count = 0;
  TimeUnit unit = TimeUnit::step;
  std::string to_string() const;
  bool operator==(const Duration& o) const { return count == o.count && unit == o.unit; }
};

/// Parses "N:unit"; returns nullopt for anything else (the caller reports where).
std::optional<Duration> parse_duration(const std::string& text);

/// The recipe error message for a malformed duration.
std::string duration_expectation(const std::string& got);

const char* to_string(TimeUnit u);

}  // namespace refit
