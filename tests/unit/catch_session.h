#pragma once
// Catch2's session (catch_session.cpp, which holds Catch2's implementation): Catch2 2.x declares
// Catch::Session only in the unit that compiles its implementation, so a main elsewhere runs the
// tests through this.
namespace refit_test {
int run_catch_session(int argc, char* argv[]);
}
