// Every CPU backend op against the float64 reference and finite differences,
// in every activation layout the backend accepts (NHWC, nChw16c, nChw8c, NCHW).
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "backend/backend_checks.h"
#include "resnet_ddp/errors.h"

using namespace rd;
using namespace rd::test;

namespace {

// One CPU backend per supported layout; a layout the backend rejects is skipped
// with a warning, but the default (NHWC) must work.
std::vector<std::unique_ptr<Backend>> cpu_backends() {
  std::vector<std::unique_ptr<Backend>> all;
  for (Layout layout : {Layout::NHWC, Layout::NCHW16C, Layout::NCHW8C, Layout::NCHW}) {
    BackendOptions opts;
    opts.layout = layout;
    try {
      auto be = make_cpu_backend(opts);
      REQUIRE(be->activation_layout() == layout);
      REQUIRE(be->device() == DeviceKind::CPU);
      all.push_back(std::move(be));
    } catch (const rd::Error& e) {
      if (layout == Layout::NHWC) FAIL("the default NHWC layout is rejected: " << e.what());
      WARN("CPU backend rejects layout " << layout_name(layout) << ": " << e.what());
    }
  }
  return all;
}

}  // namespace

TEST_CASE("cpu backend: NCHW copies round-trip in every layout", "[kernel]") {
  for (auto& be : cpu_backends())
    for (Dims d : {Dims{2, 3, 5, 7}, Dims{1, 17, 3, 2}, Dims{3, 32, 1, 1}, Dims{2, 48, 3, 5}})
      check_copy_roundtrip(*be, d);
}

TEST_CASE("cpu backend: conv2d forward/backward vs reference and finite differences", "[kernel]") {
  const std::vector<ConvCase> cases{
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
  // Every layout with the default algorithm choice, then NHWC forced to each
  // algorithm (Winograd falls back to direct where oneDNN has no Winograd kernel).
  auto backends = cpu_backends();
  for (ConvAlgo algo : {ConvAlgo::Direct, ConvAlgo::Winograd}) {
    BackendOptions opts;
    opts.conv_algo = algo;
    backends.push_back(make_cpu_backend(opts));
  }
  for (auto& be : backends)
    for (const ConvCase& c : cases) {
      // Finite differences on the small shapes only: the large ones run the
      // same formulas in other kernels, and the reference comparison covers them.
      const bool small = c.in_c * c.out_c <= 512;
      check_conv2d(*be, c, Tol{}, small);
    }
}

TEST_CASE("cpu backend: batch norm train/eval/backward vs reference and finite differences", "[kernel]") {
  const std::vector<BnCase> cases{
      {2, 5, 3, 3, false}, {2, 5, 3, 3, true}, {1, 7, 5, 4, true},
      {4, 16, 2, 2, false}, {3, 20, 3, 5, true}, {8, 3, 1, 1, true},
      {2, 64, 5, 5, true}, {2, 128, 3, 3, false},
      {3, 32, 37, 3, true},  // more than one 32-row float block per plane in nChw16c
      {4, 32, 1, 1, true},   // 1x1 planes (ResNet's last stage at 32 px) in nChw16c
  };
  for (auto& be : cpu_backends())
    for (const BnCase& c : cases) check_batchnorm(*be, c);
}

TEST_CASE("cpu backend: batch-norm running statistics over several steps", "[kernel]") {
  for (auto& be : cpu_backends()) {
    check_batchnorm_running_stats(*be, BnCase{4, 6, 3, 3, true}, 5);
    check_batchnorm_running_stats(*be, BnCase{2, 18, 2, 1, false}, 3);
    check_batchnorm_running_stats(*be, BnCase{3, 32, 3, 2, true}, 3);  // nChw16c-blocked
  }
}

TEST_CASE("cpu backend: batch norm through the SyncBatchNorm reducer seam", "[kernel]") {
  for (auto& be : cpu_backends()) {
    check_batchnorm_sync(*be, BnCase{2, 5, 3, 3, true}, 2);
    check_batchnorm_sync(*be, BnCase{1, 18, 2, 3, false}, 3);
    check_batchnorm_sync(*be, BnCase{2, 48, 3, 3, true}, 2);  // nChw16c-blocked
  }
}

TEST_CASE("cpu backend: relu, residual add, accumulate", "[kernel]") {
  for (auto& be : cpu_backends())
    for (Dims d : {Dims{2, 3, 5, 7}, Dims{1, 17, 3, 3}, Dims{2, 32, 2, 2}}) {
      check_relu(*be, d);
      check_add(*be, d, false);
      check_add(*be, d, true);
      check_accumulate(*be, d);
    }
}

TEST_CASE("cpu backend: relu on the MLP head's (N, 512) matrix", "[kernel]") {
  for (auto& be : cpu_backends()) {
    check_relu_matrix(*be, 16, 512);
    check_relu_matrix(*be, 3, 7);
  }
}

TEST_CASE("cpu backend: max pool vs reference (ties, -inf padding) and finite differences", "[kernel]") {
  const std::vector<PoolCase> cases{
      {2, 3, 8, 8}, {1, 5, 7, 9}, {2, 17, 5, 5}, {1, 2, 1, 1}, {1, 4, 6, 6, 2, 2, 0}, {2, 64, 9, 9},
      {2, 32, 7, 6}, {1, 16, 5, 5, 2, 2, 0},
  };
  for (auto& be : cpu_backends())
    for (const PoolCase& c : cases)
      for (const char* values : {"distinct", "ties", "negative"}) check_maxpool(*be, c, values);
}

TEST_CASE("cpu backend: global average pool", "[kernel]") {
  for (auto& be : cpu_backends())
    for (Dims d : {Dims{2, 5, 3, 3}, Dims{1, 17, 1, 1}, Dims{3, 8, 7, 5}, Dims{2, 512, 2, 2}, Dims{3, 48, 3, 5}, Dims{3, 32, 1, 1}})
      check_global_avgpool(*be, d);
}

TEST_CASE("cpu backend: linear", "[kernel]") {
  auto be = make_cpu_backend();
  for (LinearCase c : {LinearCase{2, 5, 3}, LinearCase{1, 17, 10}, LinearCase{5, 64, 7}, LinearCase{4, 512, 512}})
    check_linear(*be, c);
}

TEST_CASE("cpu backend: label-smoothed softmax cross-entropy", "[kernel]") {
  auto be = make_cpu_backend();
  check_softmax_xent(*be, 4, 3, 0.f, 1.f);
  check_softmax_xent(*be, 5, 10, 0.1f, 1.f);
  check_softmax_xent(*be, 3, 1000, 0.1f, 0.5f);
  check_softmax_xent(*be, 1, 2, 0.3f, 2.f);
}

TEST_CASE("cpu backend: softmax_xent_sums, queued copies and timing marks (the step's read-back)", "[kernel]") {
  auto be = make_cpu_backend();
  check_softmax_xent_sums_all(*be);
  check_queued_copies(*be);
  check_timing_marks(*be);
}

TEST_CASE("cpu backend: Adam and SGD steps", "[kernel]") {
  auto be = make_cpu_backend();
  for (size_t count : {size_t{1}, size_t{37}, size_t{1000}}) {
    check_adam(*be, count, 0.f, 3);
    check_adam(*be, count, 0.01f, 3);
    check_sgd(*be, count, 0.9f, 0.f, 0.f, false, 3);
    check_sgd(*be, count, 0.9f, 0.1f, 1e-4f, false, 3);
    check_sgd(*be, count, 0.9f, 0.f, 1e-4f, true, 3);
    check_sgd(*be, count, 0.f, 0.f, 0.f, false, 2);
    check_ema(*be, count, 0.9, 5);
    check_ema(*be, count, 0.99998, 3);
    check_ema(*be, count, 0.0, 2);  // alpha clamped to 1: the average is the model
  }
  check_segment_ops(*be);
}

TEST_CASE("cpu backend: fill, scale, all_finite, u8 images", "[kernel]") {
  for (auto& be : cpu_backends()) {
    check_fill_scale_finite(*be, 1);
    check_fill_scale_finite(*be, 37);
    check_fill_scale_finite(*be, 1031);
    check_images_u8(*be, Dims{2, 3, 5, 7}, false);
    check_images_u8(*be, Dims{1, 3, 4, 4}, true);
    check_erase_rectangles(*be);
  }
}

TEST_CASE("cpu backend: MixUp / CutMix batch mixing and the mixed-target loss", "[kernel]") {
  for (auto& be : cpu_backends()) check_mixing_ops(*be);
}
