// CPU backend in bf16 mode (AMX / AVX512-BF16): convolutions read bf16 copies of
// their inputs and output gradients and accumulate in fp32, as PyTorch's autocast
// does, so they must match the float64 reference to bf16 accuracy (8-bit
// mantissa: ~0.4 % per product, less after fp32 accumulation). Skipped on CPUs
// without bf16 support.
#include <catch2/catch.hpp>

#include "backend/backend_checks.h"
#include "resnet_ddp/errors.h"

using namespace rd;
using namespace rd::test;

namespace {

std::unique_ptr<Backend> bf16_backend(Layout layout) {
  BackendOptions o;
  o.precision = Precision::BF16;
  o.layout = layout;
  try {
    return make_cpu_backend(o);
  } catch (const UsageError& e) {
    WARN("bf16 CPU backend unavailable here: " << e.what());
    return nullptr;
  }
}

}  // namespace

TEST_CASE("cpu backend bf16: convolutions match the reference to bf16 accuracy", "[kernel][bf16]") {
  for (Layout layout : {Layout::NCHW16C, Layout::NCHW8C, Layout::NHWC, Layout::NCHW}) {
    auto be = bf16_backend(layout);
    if (!be) return;
    REQUIRE(be->name().find("bf16") != std::string::npos);
    const Tol bf16_tol{2e-2, 2e-2};
    for (const ConvCase& c : {ConvCase{2, 3, 17, 13, 8, 7, 2, 3}, ConvCase{1, 16, 9, 9, 32, 3, 1, 1},
                              ConvCase{3, 32, 8, 8, 16, 1, 2, 0}, ConvCase{2, 64, 15, 15, 64, 3, 1, 1},
                              ConvCase{2, 64, 9, 9, 64, 3, 2, 1, 32}, ConvCase{2, 32, 8, 8, 32, 3, 1, 1, 2}})
      check_conv2d(*be, c, bf16_tol, /*finite_differences=*/false);
  }
}

TEST_CASE("cpu backend bf16: other ops stay fp32-exact", "[kernel][bf16]") {
  auto be = bf16_backend(Layout::NHWC);
  if (!be) return;
  // Only convolutions change precision: batch norm, pooling, linear and the
  // optimizers keep the fp32 tolerances.
  check_batchnorm(*be, BnCase{3, 5, 4, 3, true}, Tol{}, /*finite_differences=*/false);
  check_linear(*be, LinearCase{5, 64, 7}, Tol{});
  check_adam(*be, 37, 0.01f, 3);
}
