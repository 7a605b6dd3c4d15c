// Every CPU backend op against the float64 reference and finite differences,
// in every activation layout the backend accepts (NHWC, nChw16c, nChw8c, NCHW), through
// the op-test table (op_table.h) that the GPU test runs too.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "backend/op_table.h"
#include "resnet_ddp/errors.h"

using namespace rd;
using namespace rd::test;

namespace {

const OpCases& cpu_cases() {
  static const OpCases cases = [] {
    OpCases c;
    c.copy_dims = {Dims{2, 3, 5, 7}, Dims{1, 17, 3, 2}, Dims{3, 32, 1, 1}, Dims{2, 48, 3, 5}};
    c.conv = {
        {2, 3, 7, 7, 4, 3, 1, 1},    // basic 3x3
        {1, 5, 9, 8, 6, 3, 2, 1},    // batch 1, odd sizes, stride 2
        {2, 8, 6, 6, 16, 1, 2, 0},   // downsample 1x1 / 2
        {1, 3, 17, 15, 8, 7, 2, 3},  // stem 7x7 / 2 pad 3
        {3, 16, 5, 5, 16, 3, 1, 1},  // channels a multiple of 16
        {2, 17, 4, 5, 3, 3, 1, 0},   // 17 channels, no padding
        {1, 4, 3, 3, 5, 3, 2, 1},    // tiny spatial
        // ResNet-sized channel counts, which select oneDNN's vectorised (JIT) kernels.
        {2, 64, 8, 8, 64, 3, 1, 1},
        {2, 64, 9, 9, 128, 3, 2, 1},
        {2, 64, 9, 9, 128, 1, 2, 0},
        {2, 3, 20, 20, 64, 7, 2, 3},
        {1, 128, 3, 3, 32, 1, 1, 0},
        // Winograd-eligible (3x3, stride 1, channels a multiple of 16): output sizes
        // that are not a multiple of its 4x4 tiles, and the >= 8x8 that auto picks.
        {2, 16, 10, 13, 32, 3, 1, 1},
        {1, 32, 9, 9, 16, 3, 1, 1},
        // Grouped (ResNeXt): 2..32 groups, 1 to 16 channels per group, strided and
        // 1x1; Winograd-shaped ones must take the direct path.
        {2, 8, 6, 6, 8, 3, 1, 1, 2},
        {1, 12, 7, 7, 6, 3, 2, 1, 3},
        {2, 8, 5, 5, 8, 3, 1, 1, 8},
        {2, 64, 8, 8, 64, 3, 1, 1, 32},
        {1, 64, 9, 9, 64, 3, 2, 1, 4},
        {2, 32, 10, 10, 32, 3, 1, 1, 2},
        {2, 16, 5, 5, 32, 1, 1, 0, 4},
    };
    c.conv_fd_max_channel_product = 512;
    c.batchnorm = {
        {2, 5, 3, 3, false}, {2, 5, 3, 3, true}, {1, 7, 5, 4, true},
        {4, 16, 2, 2, false}, {3, 20, 3, 5, true}, {8, 3, 1, 1, true},
        {2, 64, 5, 5, true}, {2, 128, 3, 3, false},
        {3, 32, 37, 3, true},  // more than one 32-row float block per plane in nChw16c
        {4, 32, 1, 1, true},   // 1x1 planes (ResNet's last stage at 32 px) in nChw16c
    };
    c.bn_running_stats = {{BnCase{4, 6, 3, 3, true}, 5}, {BnCase{2, 18, 2, 1, false}, 3},
                          {BnCase{3, 32, 3, 2, true}, 3}};  // the last nChw16c-blocked
    c.bn_sync = {{BnCase{2, 5, 3, 3, true}, 2}, {BnCase{1, 18, 2, 3, false}, 3},
                 {BnCase{2, 48, 3, 3, true}, 2}};  // the last nChw16c-blocked
    c.eltwise_dims = {Dims{2, 3, 5, 7}, Dims{1, 17, 3, 3}, Dims{2, 32, 2, 2}};
    c.maxpool = {{2, 3, 8, 8}, {1, 5, 7, 9}, {2, 17, 5, 5}, {1, 2, 1, 1}, {1, 4, 6, 6, 2, 2, 0}, {2, 64, 9, 9},
                 {2, 32, 7, 6}, {1, 16, 5, 5, 2, 2, 0}};
    c.global_avgpool_dims = {Dims{2, 5, 3, 3}, Dims{1, 17, 1, 1}, Dims{3, 8, 7, 5},
                             Dims{2, 512, 2, 2}, Dims{3, 48, 3, 5}, Dims{3, 32, 1, 1}};
    c.linear = {LinearCase{2, 5, 3}, LinearCase{1, 17, 10}, LinearCase{5, 64, 7}, LinearCase{4, 512, 512}};
    c.softmax = {{4, 3, 0.f, 1.f}, {5, 10, 0.1f, 1.f}, {3, 1000, 0.1f, 0.5f}, {1, 2, 0.3f, 2.f}};
    c.optimizer_counts = {1, 37, 1000};
    c.ema = {{0.9, 5}, {0.99998, 3}, {0.0, 2}};  // decay 0: alpha clamped to 1, the average is the model
    c.fill_counts = {1, 37, 1031};
    return c;
  }();
  return cases;
}

// One CPU backend per supported layout (the activation checks); a layout the backend
// rejects is skipped with a warning, but the default (NHWC) must work. The default
// options run the layout-independent checks, and again forced to each algorithm the
// convolutions (Winograd falls back to direct where oneDNN has no Winograd kernel).
const std::vector<OpCheckConfig>& cpu_configs() {
  static const std::vector<OpCheckConfig> configs = [] {
    std::vector<OpCheckConfig> all;
    auto add = [&all](std::string label, BackendOptions opts, unsigned scopes) {
      OpCheckConfig cfg;
      cfg.label = std::move(label);
      cfg.scopes = scopes;
      cfg.cases = &cpu_cases();
      cfg.make = [opts] {
        auto be = make_cpu_backend(opts);
        if (opts.layout) REQUIRE(be->activation_layout() == *opts.layout);
        REQUIRE(be->device() == DeviceKind::CPU);
        return be;
      };
      all.push_back(std::move(cfg));
    };
    for (Layout layout : {Layout::NHWC, Layout::NCHW16C, Layout::NCHW8C, Layout::NCHW}) {
      BackendOptions opts;
      opts.layout = layout;
      try {
        make_cpu_backend(opts);
      } catch (const rd::Error& e) {
        if (layout == Layout::NHWC) FAIL("the default NHWC layout is rejected: " << e.what());
        WARN("CPU backend rejects layout " << layout_name(layout) << ": " << e.what());
        continue;
      }
      add(layout_name(layout), opts, kActivations | kConvolutions);
    }
    add("default options", BackendOptions{}, kFlatBuffers);
    for (ConvAlgo algo : {ConvAlgo::Direct, ConvAlgo::Winograd}) {
      BackendOptions opts;
      opts.conv_algo = algo;
      add(algo == ConvAlgo::Direct ? "direct convolutions" : "Winograd convolutions", opts, kConvolutions);
    }
    return all;
  }();
  return configs;
}

[[maybe_unused]] const bool cpu_op_table_registered = register_op_table("cpu backend", "[kernel]", cpu_configs);

}  // namespace
