// The text plugin's dropout (plugins/text/dropout.h): Philox4x32-10 against Random123's
// known-answer vectors; the mask keeps 1 - p of the elements, scaled as at::dropout scales them;
// it follows the default CPU generator (reproducible, resumable) and its gradient is the mask.
#include <cmath>

// Before Catch: c10's logging header defines CHECK too, and Catch's must win.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "text/dropout.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_text_dropout {

using refit::text::philox4x32_10;

TEST_CASE("text dropout: Philox4x32-10 gives Random123's known answers") {
  struct Case {
    std::uint32_t counter[4], key[2], expected[4];
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& c : cases) {
    std::uint32_t out[4];
    philox4x32_10(c.counter, c.key, out);
    for (int i = 0; i < 4; ++i) CHECK(out[i] == c.expected[i]);
  }
}

TEST_CASE("text dropout: keeps 1 - p of the elements, scaled by 1 / (1 - p) in the input's dtype") {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(0);
    const at::Tensor x = at::ones({1000, 1001}, dtype);  // an odd size: the last block is partial
    const at::Tensor y = refit::text::dropout(x, 0.1, true);
    REQUIRE(y.scalar_type() == dtype);
    const at::Tensor kept = y != 0;
    const double fraction = kept.to(at::kDouble).mean().item<double>();
    // 1,001,000 Bernoulli(0.9) draws: standard deviation 3e-4.
    CHECK(std::abs(fraction - 0.9) < 5 * std::sqrt(0.9 * 0.1 / x.numel()));
    const double scale = at::scalar_tensor(1.0 / 0.9, dtype).item<double>();
    CHECK(y.masked_select(kept).eq(at::scalar_tensor(scale, dtype)).all().item<bool>());
    // The first row and the last (which ends in a partial block of 4) are drawn like the rest.
    CHECK(kept.slice(0, 0, 1).to(at::kDouble).mean().item<double>() > 0.8);
    CHECK(kept.slice(0, 999, 1000).to(at::kDouble).mean().item<double>() > 0.8);
  }
}

TEST_CASE("text dropout: follows the default CPU generator, a fresh mask per call, identity in eval") {
  const at::Tensor x = at::randn({64, 384});
  at::manual_seed(7);
  const at::Tensor a = refit::text::dropout(x, 0.1, true);
  const at::Tensor b = refit::text::dropout(x, 0.1, true);
  at::manual_seed(7);
  const at::Tensor a2 = refit::text::dropout(x, 0.1, true);
  CHECK(at::equal(a, a2));
  CHECK_FALSE(at::equal(a, b));
  CHECK(refit::text::dropout(x, 0.1, false).is_same(x));
  CHECK(refit::text::dropout(x, 0.0, true).is_same(x));
}

TEST_CASE("text dropout: the gradient is the scaled mask") {
  at::manual_seed(3);
  const at::Tensor x = at::randn({32, 97}).requires_grad_(true);
  const at::Tensor y = refit::text::dropout(x, 0.25, true);
  y.sum().backward();
  const at::Tensor mask = (y.detach() != 0).to(at::kFloat) / 0.75;
  CHECK(at::allclose(x.grad(), mask));
}

}  // namespace refit_test_text_dropout
