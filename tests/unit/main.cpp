// The unit tests run as `refit` runs: bf16 products configured for this CPU first
// (precision/bf16_products.h; REFIT_BF16_PRODUCTS=native|fp32 forces either path).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "precision/bf16_products.h"

int main(int argc, char* argv[]) {
  refit::precision::configure_bf16_products();
  return Catch::Session().run(argc, argv);
}
