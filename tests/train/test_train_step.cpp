// LossScaler and TrainStep on the CPU backend: the fp16 dynamic loss scale (skip and
// halve on overflow, growth after 2000 good steps, never below 1), gradient
// accumulation, and a skipped update on a non-finite gradient. The GPU runs the same
// classes (tests/gpu_emu/train_emu.sh injects the overflow through
// RD_INJECT_OVERFLOW_STEP); here they run in milliseconds on every machine.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "common/compare.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/data/loader.h"
#include "resnet_ddp/train/train_step.h"
#include "train/evaluate.h"
#include "train/train_test_util.h"

using namespace rd;
using namespace rd::train;
using rd::test::host;

namespace {

constexpr int kPixels = 64;  // 32 px would leave the last stage 1x1: BN over 2 pixels outputs +-1
constexpr int kClasses = 3;

std::unique_ptr<Backend> cpu() {
  BackendOptions o;
  o.threads = 1;
  // Direct convolution: its rounding does not depend on the batch split.
  o.conv_algo = ConvAlgo::Direct;
  return make_cpu_backend(o);
}

// A one-slice gradient arena holding `values`.
struct Grads {
  Arena arena;
  Grads(Backend& be, const std::vector<float>& values) {
    arena.add("g", Shape{static_cast<int64_t>(values.size())});
    arena.allocate(be);
    be.copy_from_host(arena.data(), values.data(), values.size() * sizeof(float));
  }
  std::vector<float> read(Backend& be) { return host(be, arena.ptr(0), arena.slice(0).count); }
};

std::unique_ptr<ResNet> tiny(Backend& be) {
  ResNetConfig c;
  c.arch = "resnet_tiny";
  c.head = HeadKind::Fc;
  c.num_classes = kClasses;
  auto m = std::make_unique<ResNet>(be, c);
  m->init_parameters(11);
  m->train(true);
  return m;
}

OptimizerConfig sgd(double lr) {
  OptimizerConfig c;
  c.type = OptimizerKind::Sgd;
  c.lr = lr;
  return c;
}

// `n` random images (seeded) in the model's input buffer.
const Tensor& images(ResNet& m, int n, uint64_t seed) {
  Tensor& in = m.input_buffer(n, kPixels, kPixels);
  const std::vector<float> x = rd::test::random_floats(static_cast<size_t>(n) * 3 * kPixels * kPixels, seed);
  m.backend().copy_from_host_nchw(x.data(), in);
  return in;
}

std::vector<float> all(Backend& be, const Arena& a) { return host(be, a.data(), a.size()); }

// LossScaler::unscale, then the verdict it left in the backend's memory (read back here:
// the trainer never reads it). True: the step goes ahead.
bool unscaled_finite(Backend& be, LossScaler& s, Arena& grads, bool any_nonfinite) {
  s.unscale(grads, any_nonfinite);
  math::AmpStepState state;
  be.copy_to_host(&state, s.device_state(), sizeof state);
  return state.found_inf == 0.0;
}

// Forward and backward of micro-batch `micro` of `group` (2 samples, seeded by `seed`).
void micro_batch(TrainStep& step, ResNet& m, int micro, int group, uint64_t seed) {
  const int32_t labels[2] = {static_cast<int32_t>(seed % kClasses), static_cast<int32_t>((seed + 1) % kClasses)};
  step.forward(images(m, 2, seed), labels, micro, group);
  step.backward_and_reduce();
}

}  // namespace

TEST_CASE("LossScaler disabled: scale 1, gradients untouched, no device state", "[train]") {
  auto be = cpu();
  Grads g(*be, {1.f, 2.f, std::numeric_limits<float>::infinity()});
  LossScaler s(*be, false);
  CHECK(s.scale() == 1.0);
  CHECK(s.device_state() == nullptr);  // fp32 runs check the loss instead (TrainStep skips on the caller's flag)
  s.unscale(g.arena, false);
  s.unscale(g.arena, true);
  CHECK(s.skipped_steps() == 0);
  const std::vector<float> v = g.read(*be);
  CHECK(v[0] == 1.f);
  CHECK(v[1] == 2.f);
  CHECK(s.scale() == 1.0);
}

TEST_CASE("LossScaler: a finite step unscales, an overflowing one is skipped and halves the scale", "[train]") {
  auto be = cpu();
  LossScaler s(*be, true, 1024.0);
  Grads g(*be, {1024.f, -2048.f, 512.f});
  CHECK(unscaled_finite(*be, s, g.arena, false));
  CHECK(g.read(*be) == std::vector<float>{1.f, -2.f, 0.5f});
  CHECK(s.scale() == 1024.0);

  Grads inf(*be, {1.f, std::numeric_limits<float>::infinity(), 1.f});
  CHECK_FALSE(unscaled_finite(*be, s, inf.arena, false));
  CHECK(s.scale() == 512.0);
  Grads nan(*be, {std::nanf(""), 1.f});
  CHECK_FALSE(unscaled_finite(*be, s, nan.arena, false));
  CHECK(s.scale() == 256.0);
  // Another rank's non-finite loss skips a step whose own gradients are finite.
  Grads fine(*be, {1.f, 1.f});
  CHECK_FALSE(unscaled_finite(*be, s, fine.arena, true));
  CHECK(s.scale() == 128.0);
  CHECK(s.skipped_steps() == 3);
}

TEST_CASE("LossScaler doubles after 2000 good steps in a row, an overflow restarts the count", "[train]") {
  auto be = cpu();
  LossScaler s(*be, true, 4.0);
  Grads g(*be, {0.f});
  Grads inf(*be, {std::numeric_limits<float>::infinity()});
  for (int i = 0; i < 1999; ++i) REQUIRE(unscaled_finite(*be, s, g.arena, false));
  CHECK(s.scale() == 4.0);
  CHECK(unscaled_finite(*be, s, g.arena, false));
  CHECK(s.scale() == 8.0);
  for (int i = 0; i < 1000; ++i) REQUIRE(unscaled_finite(*be, s, g.arena, false));
  CHECK_FALSE(unscaled_finite(*be, s, inf.arena, false));  // 1000 good, then an overflow
  CHECK(s.scale() == 4.0);
  for (int i = 0; i < 1999; ++i) REQUIRE(unscaled_finite(*be, s, g.arena, false));
  CHECK(s.scale() == 4.0);  // not 8: the count restarted at the overflow
  CHECK(unscaled_finite(*be, s, g.arena, false));
  CHECK(s.scale() == 8.0);
}

TEST_CASE("LossScaler never halves below 1", "[train]") {
  auto be = cpu();
  LossScaler s(*be, true, 2.0);
  Grads inf(*be, {std::numeric_limits<float>::infinity()});
  CHECK_FALSE(unscaled_finite(*be, s, inf.arena, false));
  CHECK(s.scale() == 1.0);
  CHECK_FALSE(unscaled_finite(*be, s, inf.arena, false));
  CHECK(s.scale() == 1.0);
  CHECK_FALSE(unscaled_finite(*be, s, inf.arena, true));
  CHECK(s.scale() == 1.0);
}

TEST_CASE("TrainStep accumulation: a group of micro-batches gives the mean of their gradients", "[train]") {
  // Batch norm normalises each micro-batch on its own (as PyTorch's accumulation
  // does), so the group equals one batch whose BN sees the micro-batches
  // separately: the mean of the per-micro-batch gradients.
  auto be = cpu();
  constexpr int kGroup = 3;
  std::vector<std::vector<float>> single;
  for (int micro = 0; micro < kGroup; ++micro) {
    auto m = tiny(*be);
    Optimizer opt(*be, m->params(), m->grads(), sgd(0.1));
    TrainStep step(*m, opt, nullptr, 0.1f);
    micro_batch(step, *m, 0, 1, 100 + micro);
    single.push_back(all(*be, m->grads()));
  }
  auto m = tiny(*be);
  const std::vector<float> before = all(*be, m->params());
  Optimizer opt(*be, m->params(), m->grads(), sgd(0.1));
  TrainStep step(*m, opt, nullptr, 0.1f);
  for (int micro = 0; micro < kGroup; ++micro) micro_batch(step, *m, micro, kGroup, 100 + micro);
  const std::vector<float> grads = all(*be, m->grads());
  REQUIRE(grads.size() == single[0].size());
  double worst = 0, largest = 0;
  std::vector<float> mean(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    mean[i] = (single[0][i] + single[1][i] + single[2][i]) / kGroup;
    worst = std::max(worst, std::fabs(double(grads[i]) - mean[i]));
    largest = std::max(largest, std::fabs(double(mean[i])));
  }
  CHECK(largest > 1e-3);  // not vacuous
  CHECK(worst <= 1e-5 * largest);
  // The update is plain SGD with the mean gradient (no weight decay, no momentum).
  step.update();
  REQUIRE(step.skipped_steps() == 0);
  const std::vector<float> after = all(*be, m->params());
  double off = 0;
  for (size_t i = 0; i < after.size(); ++i)
    off = std::max(off, std::fabs(double(after[i]) - (before[i] - 0.1f * grads[i])));
  CHECK(off <= 1e-6);
}

TEST_CASE("TrainStep fp16: a non-finite gradient skips the update and halves the scale, then training goes on",
          "[train]") {
  auto be = cpu();
  auto m = tiny(*be);
  Optimizer opt(*be, m->params(), m->grads(), sgd(0.05));
  TrainStep step(*m, opt, nullptr, 0.0f, /*loss_scaling=*/true, 1024.0);
  step.inject_overflow_at(2);  // as RD_INJECT_OVERFLOW_STEP=2 does
  std::vector<float> p0 = all(*be, m->params());
  micro_batch(step, *m, 0, 1, 1);
  step.update();
  CHECK(step.skipped_steps() == 0);
  std::vector<float> p1 = all(*be, m->params());
  CHECK(p1 != p0);
  CHECK(step.scaler().scale() == 1024.0);

  micro_batch(step, *m, 0, 1, 2);
  step.update();
  CHECK(all(*be, m->params()) == p1);  // skipped: parameters untouched
  CHECK(step.skipped_steps() == 1);
  CHECK(step.scaler().scale() == 512.0);

  micro_batch(step, *m, 0, 1, 3);
  step.update();
  CHECK(all(*be, m->params()) != p1);
  CHECK(step.skipped_steps() == 1);
  CHECK(step.scaler().scale() == 512.0);

  // Without fp16 a rank's non-finite loss (the caller's flag) skips the update too.
  TrainStep plain(*m, opt, nullptr, 0.0f);
  micro_batch(plain, *m, 0, 1, 4);
  const std::vector<float> p3 = all(*be, m->params());
  plain.update(/*any_nonfinite=*/true);
  CHECK(all(*be, m->params()) == p3);
  CHECK(plain.skipped_steps() == 1);
}

TEST_CASE("TrainStep fp16 with Adam: a skipped step changes no state and does not advance the step count",
          "[train]") {
  auto be = cpu();
  OptimizerConfig adam;
  adam.type = OptimizerKind::Adam;
  adam.lr = 1e-3;
  auto m = tiny(*be);
  Optimizer opt(*be, m->params(), m->grads(), adam);
  TrainStep step(*m, opt, nullptr, 0.0f, /*loss_scaling=*/true, 1024.0);
  step.inject_overflow_at(2);
  const size_t n = m->params().size();
  micro_batch(step, *m, 0, 1, 1);
  step.update();
  CHECK(opt.steps() == 1);
  const std::vector<float> p1 = all(*be, m->params());
  const std::vector<float> m1 = host(*be, opt.state(0), n), v1 = host(*be, opt.state(1), n);
  micro_batch(step, *m, 0, 1, 2);
  step.update();
  CHECK(step.skipped_steps() == 1);
  CHECK(opt.steps() == 1);
  CHECK(all(*be, m->params()) == p1);
  CHECK(host(*be, opt.state(0), n) == m1);
  CHECK(host(*be, opt.state(1), n) == v1);
  CHECK(opt.export_state().step == 1);
  micro_batch(step, *m, 0, 1, 3);
  step.update();
  CHECK(opt.steps() == 2);
  // The same two batches without the skipped one between them: step 2's bias corrections
  // (step 3's would move each parameter by ~4e-4 more).
  auto ref = tiny(*be);
  Optimizer ref_opt(*be, ref->params(), ref->grads(), adam);
  TrainStep ref_step(*ref, ref_opt, nullptr, 0.0f);
  for (uint64_t seed : {1, 3}) {
    micro_batch(ref_step, *ref, 0, 1, seed);
    ref_step.update();
  }
  const std::vector<float> got = all(*be, m->params()), want = all(*be, ref->params());
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  CHECK(worst <= 1e-6);
}

TEST_CASE("TrainStep fp16: the loss scale cancels out of the gradients and grows after 2000 good updates", "[train]") {
  auto be = cpu();
  auto fp32 = tiny(*be), fp16 = tiny(*be);
  Optimizer opt32(*be, fp32->params(), fp32->grads(), sgd(0.0));
  Optimizer opt16(*be, fp16->params(), fp16->grads(), sgd(0.0));
  TrainStep plain(*fp32, opt32, nullptr, 0.1f);
  TrainStep scaled(*fp16, opt16, nullptr, 0.1f, /*loss_scaling=*/true, 256.0);
  micro_batch(plain, *fp32, 0, 1, 5);
  micro_batch(scaled, *fp16, 0, 1, 5);
  plain.update();
  scaled.update();  // unscales the gradients in place before the (lr 0) step
  const std::vector<float> g32 = all(*be, fp32->grads()), g16 = all(*be, fp16->grads());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < g32.size(); ++i) {
    worst = std::max(worst, std::fabs(double(g16[i]) - g32[i]));
    largest = std::max(largest, std::fabs(double(g32[i])));
  }
  CHECK(largest > 1e-3);
  CHECK(worst <= 1e-5 * largest);  // a power-of-two scale: equal up to rounding
  // Growth counts updates, whatever ran before them: 1999 more good ones keep the
  // scale, the 2000th doubles it.
  for (int i = 1; i < 1999; ++i) scaled.update();
  CHECK(scaled.scaler().scale() == 256.0);
  scaled.update();
  CHECK(scaled.scaler().scale() == 512.0);
  CHECK(scaled.skipped_steps() == 0);
}

// torchvision's preset: ToTensor -> Normalize -> RandomErasing(value 0). The loader's boxes
// are zeroed in the normalised input, the rest is Normalize's output.
TEST_CASE("upload_batch: RandomErasing's boxes are zero after Normalize, the rest normalised", "[train][data]") {
  auto be = make_cpu_backend({});
  auto model = rd::test::trained_tiny(*be, HeadKind::Mlp, 3, 11);
  const int n = 2, h = 6, w = 5;
  std::vector<uint8_t> images(static_cast<size_t>(n * h * w * 3));
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(i * 29 % 256);
  data::Batch batch;
  batch.n = n;
  batch.h = h;
  batch.w = w;
  batch.images = images.data();
  batch.erase_boxes = {1, 2, 3, 2, 0, 0, 0, 0};  // image 0: rows 1-3, cols 2-3; image 1: none
  const train::Normalization norm = train::normalization("imagenet");
  std::vector<float> got(images.size());
  be->copy_to_host_nchw(train::upload_batch(*model, batch, norm), got.data());
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          const bool erased = i == 0 && y >= 1 && y < 4 && x >= 2 && x < 4;
          const float v = images[static_cast<size_t>(((i * h + y) * w + x) * 3 + c)] / 255.f;
          const float expected = erased ? 0.f : (v - norm.mean[c]) / norm.std[c];
          INFO("image " << i << " channel " << c << " at " << y << "," << x);
          CHECK(got[static_cast<size_t>(((i * 3 + c) * h + y) * w + x)] == Approx(expected).margin(1e-6));
        }
}
