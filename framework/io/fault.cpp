#include "io/fault.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace refit::io {

namespace {

struct FaultPlan {
  long long at = 0;  // the point that ends the process; 0: none
  bool list = false;
  FaultPlan() {
    const char* v = std::getenv("REFIT_FAULT_AT");
    if (!v || !*v) return;
    if (std::strcmp(v, "list") == 0) {
      list = true;
      return;
    }
    at = std::atoll(v);
  }
};

}  // namespace

void fault_point(const char* what) {
  static const FaultPlan plan;
  static std::atomic<long long> count{0};
  if (plan.at <= 0 && !plan.list) return;
  const long long n = ++count;
  if (plan.list) std::fprintf(stderr, "fault point %lld: %s\n", n, what);
  if (n == plan.at) {
    std::fprintf(stderr, "REFIT_FAULT_AT=%lld: ending the process after \"%s\"\n", n, what);
    std::fflush(stderr);
    ::_exit(kFaultExitCode);
  }
}

}  // namespace refit::io
