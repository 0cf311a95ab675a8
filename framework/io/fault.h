#pragma once
// Injected failure points for the kill test (tests/integration/kill_at_every_point.sh).
//
// Every filesystem change a checkpoint save, a retention delete or the metrics log makes is
// followed by fault_point(). With the environment variable REFIT_FAULT_AT=N, the N-th point the
// process reaches ends it at once with _exit(kFaultExitCode) — no destructors, no flushing of
// user-space buffers — as a SIGKILL at that instant would. REFIT_FAULT_AT=list prints each
// point ("fault point N: what") to stderr instead. Without the variable a point costs a branch.
namespace refit::io {

constexpr int kFaultExitCode = 86;

void fault_point(const char* what);

}  // namespace refit::io
