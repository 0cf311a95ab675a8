// Catch2's implementation, compiled once (at -O0, like the tests) for every test executable: a
// copy in each executable's runner was a few CPU-seconds of the cold build each. The mains are
// main.cpp (refit's executables: configures bf16 products first), text_main.cpp (the
// LibTorch-free ones) and the GPU tests' own.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.h"

int refit_test::run_catch_session(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
