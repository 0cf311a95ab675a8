// Catch2's main for the LibTorch-free text tests (refit_text_tests): nothing to configure first.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
