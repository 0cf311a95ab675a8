// The unit tests run as `refit` runs: bf16 products configured for this CPU first
// (precision/bf16_products.h; REFIT_BF16_PRODUCTS=native|fp32 forces either path). Catch2
// itself is catch_session.cpp.
#include "catch_session.h"
#include "precision/bf16_products.h"

int main(int argc, char* argv[]) {
  refit::precision::configure_bf16_products();
  return refit_test::run_catch_session(argc, argv);
}
