// AutocastGuard: dtypes under autocast as in torch.autocast, nesting and restoration.
#include <ATen/ATen.h>
#include <torch/types.h>

#include "precision/autocast_guard.h"
#include "test_support.h"

// Unity builds put several test files in one unit (tests/CMakeLists.txt): this file's names,
// and its using-directives, stay in a namespace of its own.
namespace refit_test_autocast {

using namespace refit;

TEST_CASE("autocast casts matmuls to the autocast dtype and keeps fp32-listed ops in fp32") {
  auto x = torch::randn({4, 8});
  auto w = torch::randn({3, 8});
  {
    AutocastGuard guard(c10::DeviceType::CPU, c10::kBFloat16, true);
    CHECK(at::linear(x, w).scalar_type() == c10::kBFloat16);
    CHECK(at::matmul(x, w.t()).scalar_type() == c10::kBFloat16);
    // torch.autocast's CPU fp32 list includes losses such as mse_loss.
    CHECK(at::mse_loss(x, x).scalar_type() == c10::kFloat);
  }
  CHECK(at::linear(x, w).scalar_type() == c10::kFloat);
}

TEST_CASE("guards nest and restore the previous state, disabled guards turn autocast off inside") {
  const auto dev = c10::DeviceType::CPU;
  REQUIRE_FALSE(at::autocast::is_autocast_enabled(dev));
  auto before_dtype = at::autocast::get_autocast_dtype(dev);
  {
    AutocastGuard outer(dev, c10::kBFloat16, true);
    {
      AutocastGuard inner(dev, c10::kHalf, false);
      CHECK_FALSE(at::autocast::is_autocast_enabled(dev));
      CHECK(at::linear(torch::randn({2, 2}), torch::randn({2, 2})).scalar_type() == c10::kFloat);
    }
    CHECK(at::autocast::is_autocast_enabled(dev));
    CHECK(at::autocast::get_autocast_dtype(dev) == c10::kBFloat16);
  }
  CHECK_FALSE(at::autocast::is_autocast_enabled(dev));
  CHECK(at::autocast::get_autocast_dtype(dev) == before_dtype);
}

}  // namespace refit_test_autocast
