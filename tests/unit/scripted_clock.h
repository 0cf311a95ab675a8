#pragma once
// A clock for precision/shape_routing.h's per-shape policy that plays a script: each timed run
// takes the next duration, in the order the policy times them (the fp32 side's runs, then the
// native side's warm-up and runs). Any reading beyond the script fails the test.
#include <cstddef>
#include <vector>

#include <catch2/catch.hpp>

namespace refit::test {

struct ScriptedClock {
  std::vector<double> durations;
  std::size_t next = 0;
  double now = 0;
  bool started = false;  // a run's start was read, its end is next
  double read() {
    if (started) {
      REQUIRE(next < durations.size());
      now += durations[next++];
    }
    started = !started;
    return now;
  }
};

}  // namespace refit::test
