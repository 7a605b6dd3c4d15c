// CPU backend in bf16 mode (AMX / AVX512-BF16) through the op-test table (op_table.h):
// convolutions read bf16 copies of their inputs and output gradients and accumulate in
// fp32, as PyTorch's autocast does, so they must match the float64 reference to bf16
// accuracy (8-bit mantissa: ~0.4 % per product, less after fp32 accumulation); batch
// norm, linear and the optimizers keep the fp32 tolerances. Skipped on CPUs without
// bf16 support.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "backend/op_table.h"
#include "resnet_ddp/errors.h"

using namespace rd;
using namespace rd::test;

namespace {

const OpCases& bf16_cases() {
  static const OpCases cases = [] {
    OpCases c;
    c.conv = {ConvCase{2, 3, 17, 13, 8, 7, 2, 3}, ConvCase{1, 16, 9, 9, 32, 3, 1, 1},
              ConvCase{3, 32, 8, 8, 16, 1, 2, 0}, ConvCase{2, 64, 15, 15, 64, 3, 1, 1},
              ConvCase{2, 64, 9, 9, 64, 3, 2, 1, 32}, ConvCase{2, 32, 8, 8, 32, 3, 1, 1, 2}};
    c.batchnorm = {BnCase{3, 5, 4, 3, true}};
    c.linear = {LinearCase{5, 64, 7}};
    c.optimizer_counts = {37};
    return c;
  }();
  return cases;
}

// The convolutions in every layout the bf16 backend accepts; the other ops (which do not
// change precision) in NHWC. No configuration where bf16 is unavailable.
const std::vector<OpCheckConfig>& bf16_configs() {
  static const std::vector<OpCheckConfig> configs = [] {
    std::vector<OpCheckConfig> all;
    for (Layout layout : {Layout::NCHW16C, Layout::NCHW8C, Layout::NHWC, Layout::NCHW}) {
      BackendOptions opts;
      opts.precision = Precision::BF16;
      opts.layout = layout;
      try {
        make_cpu_backend(opts);
      } catch (const UsageError& e) {
        WARN("bf16 CPU backend unavailable here in " << layout_name(layout) << ": " << e.what());
        continue;
      }
      OpCheckConfig cfg;
      cfg.label = std::string("bf16 ") + layout_name(layout);
      cfg.cases = &bf16_cases();
      cfg.make = [opts] {
        auto be = make_cpu_backend(opts);
        REQUIRE(be->name().find("bf16") != std::string::npos);
        return be;
      };
      cfg.scopes = kConvolutions;
      cfg.tol = Tol{2e-2, 2e-2};
      cfg.finite_differences = false;
      all.push_back(cfg);
      if (layout == Layout::NHWC) {
        cfg.label = "bf16 NHWC, ops that stay fp32";
        cfg.scopes = kActivations | kFlatBuffers;
        cfg.tol = Tol{};
        all.push_back(cfg);
      }
    }
    return all;
  }();
  return configs;
}

[[maybe_unused]] const bool bf16_op_table_registered =
    register_op_table("cpu backend bf16", "[kernel][bf16]", bf16_configs,
                      {&op_checks::conv, &op_checks::batchnorm, &op_checks::linear, &op_checks::adam});

}  // namespace
