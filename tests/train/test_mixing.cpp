// MixUp / CutMix draws, the accuracy rule, RASampler's rules and the flags (torchvision's reference recipe).
// Equality with torch / torchvision is mix_vs_torch's; these are the invariants.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/sampler.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/train/mixing.h"
#include "train/parse_cli.h"
#include "train/train_test_util.h"  // random_floats

using namespace rd;
using namespace rd::train;

namespace {
std::string usage_error(std::vector<std::string> args) {
  try {
    parse_cli(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("mixing draws are a function of (seed, epoch, step, micro, rank)", "[train][mixing]") {
  const MixingOptions both{0.2, 1.0};
  MixingDrawKey key;
  key.seed = 3, key.epoch = 2, key.step = 17, key.micro = 1, key.rank = 1;
  const BatchMixing a = draw_batch_mixing(both, key, 224, 224), b = draw_batch_mixing(both, key, 224, 224);
  CHECK(a.image.cutmix == b.image.cutmix);
  CHECK(a.image.lambda == b.image.lambda);
  CHECK(a.target_lambda == b.target_lambda);
  CHECK(a.image.x0 == b.image.x0);
  CHECK(a.image.y1 == b.image.y1);
  // Every part of the key changes the draws (compared over many keys: one may repeat).
  auto differs = [&](auto change) {
    int differ = 0;
    for (int s = 0; s < 20; ++s) {
      MixingDrawKey k = key, k2 = key;
      k.step = k2.step = s;
      change(k2);
      differ += draw_batch_mixing(both, k, 64, 64).target_lambda != draw_batch_mixing(both, k2, 64, 64).target_lambda;
    }
    return differ;
  };
  CHECK(differs([](MixingDrawKey& k) { ++k.seed; }) >= 18);
  CHECK(differs([](MixingDrawKey& k) { ++k.epoch; }) >= 18);
  CHECK(differs([](MixingDrawKey& k) { ++k.micro; }) >= 18);
  CHECK(differs([](MixingDrawKey& k) { ++k.rank; }) >= 18);
}

TEST_CASE("MixUp alone, CutMix alone: lambdas in [0, 1], boxes inside, lambda from the box", "[train][mixing]") {
  MixingDrawKey key;
  for (int s = 0; s < 300; ++s) {
    key.step = s;
    const BatchMixing m = draw_batch_mixing(MixingOptions{0.4, 0.0}, key, 20, 30);
    CHECK_FALSE(m.image.cutmix);
    CHECK(m.image.lambda >= 0.f);
    CHECK(m.image.lambda <= 1.f);
    CHECK(m.target_lambda == m.image.lambda);
    const BatchMixing c = draw_batch_mixing(MixingOptions{0.0, 1.0}, key, 20, 30);
    REQUIRE(c.image.cutmix);
    CHECK((0 <= c.image.x0 && c.image.x0 <= c.image.x1 && c.image.x1 <= 30));
    CHECK((0 <= c.image.y0 && c.image.y0 <= c.image.y1 && c.image.y1 <= 20));
    const double area = static_cast<double>((c.image.x1 - c.image.x0) * (c.image.y1 - c.image.y0));
    CHECK(c.target_lambda == static_cast<float>(1.0 - area / 600.0));
  }
  CHECK_THROWS_AS(draw_batch_mixing(MixingOptions{}, key, 8, 8), Error);
}

TEST_CASE("Beta(alpha, alpha): moments, and tiny alphas give 0 or 1, never NaN", "[train][mixing]") {
  std::mt19937_64 gen(11);
  for (double alpha : {0.2, 0.5, 1.0, 4.0}) {
    const int n = 20000;
    double sum = 0, sq = 0;
    for (int i = 0; i < n; ++i) {
      const double x = sample_symmetric_beta(gen, alpha);
      REQUIRE((x >= 0.0 && x <= 1.0));
      sum += x;
      sq += x * x;
    }
    const double mean = sum / n, var = sq / n - mean * mean, want_var = 1.0 / (4.0 * (2.0 * alpha + 1.0));
    INFO("alpha " << alpha << " mean " << mean << " var " << var);
    CHECK(std::abs(mean - 0.5) < 0.01);  // sd of the mean <= 0.5 / sqrt(n) = 0.0035
    CHECK(std::abs(var - want_var) / want_var < 0.05);
  }
  for (int i = 0; i < 100; ++i) {
    const double x = sample_symmetric_beta(gen, 1e-4);
    REQUIRE(std::isfinite(x));
    CHECK((x < 1e-6 || x > 1.0 - 1e-6));
  }
  CHECK_THROWS_AS(sample_symmetric_beta(gen, 0.0), Error);
}

TEST_CASE("partners are the batch rolled by one, accuracy counts the mixed target's argmax", "[train][mixing]") {
  const int32_t labels[4] = {5, 1, 1, 9};
  CHECK(partner_labels(labels, 4) == std::vector<int32_t>{9, 5, 1, 1});
  CHECK(partner_labels(labels, 1) == std::vector<int32_t>{5});
  CHECK(mixed_target_class(3, 7, 0.7f) == 3);
  CHECK(mixed_target_class(3, 7, 0.3f) == 7);
  CHECK(mixed_target_class(7, 3, 0.5f) == 3);  // a tie: the lower class, as torch's max
  CHECK(mixed_target_class(4, 4, 0.1f) == 4);
}

TEST_CASE("BatchMixer: the batch itself when off; when on, the drawn mix and its targets", "[train][mixing]") {
  auto be = make_cpu_backend({});
  Tensor input = be->activation(4, 3, 8, 6);
  const std::vector<float> pixels = rd::test::random_floats(static_cast<size_t>(input.numel()), 3);
  be->copy_from_host_nchw(pixels.data(), input);
  const int32_t labels[4] = {2, 0, 7, 7};

  BatchMixer off;
  const MixedBatch same = off.mix(input, labels, 4, 0, 0, 0);
  CHECK(same.input == &input);
  CHECK(same.accuracy_targets == labels);
  CHECK(same.targets == nullptr);
  CHECK(off.description().empty());

  const MixingOptions options{0.2, 1.0};
  BatchMixer mixer(*be, options, 11, 3);
  CHECK(mixer.description() == "Batch mixing: MixUp or CutMix (one per batch) on each rank's batch, lambda ~ "
                               "Beta(alpha, alpha)");
  for (int64_t step = 0; step < 6; ++step) {
    const MixedBatch got = mixer.mix(input, labels, 4, 2, step, 1);
    // What the trainer did before the mixer existed, from the same draw key.
    const BatchMixing want = draw_batch_mixing(options, MixingDrawKey{11, 2, step, 1, 3}, 8, 6);
    Tensor expected = be->activation(4, 3, 8, 6);
    be->mix_images(input, expected, want.image);
    REQUIRE(got.input != &input);
    std::vector<float> got_pixels(pixels.size()), want_pixels(pixels.size());
    be->copy_to_host_nchw(*got.input, got_pixels.data());
    be->copy_to_host_nchw(expected, want_pixels.data());
    CHECK(got_pixels == want_pixels);
    REQUIRE(got.targets != nullptr);
    CHECK(got.targets->lambda == want.target_lambda);
    const std::vector<int32_t> partners = partner_labels(labels, 4);
    for (size_t i = 0; i < 4; ++i) {
      CHECK(got.targets->partner_labels[i] == partners[i]);
      CHECK(got.accuracy_targets[i] == mixed_target_class(labels[i], partners[i], want.target_lambda));
    }
  }
}

TEST_CASE("RASampler: counts per rank, repetitions over ranks, refusals", "[train][mixing]") {
  // n = 768, 3 ranks, 3 repetitions: each rank visits floor(768 / 3) = 256 samples, so
  // an epoch is n visits in all (an index's repetitions land on different ranks).
  std::vector<int> seen(768, 0);
  for (int r = 0; r < 3; ++r) {
    data::RASampler s(768, 3, r, 3, true, 4);
    s.set_epoch(1);
    const auto idx = s.indices();
    CHECK(idx.size() == 256);
    CHECK(s.num_selected_samples() == 256);
    for (int64_t i : idx) ++seen[static_cast<size_t>(i)];
  }
  int total = 0;
  for (int c : seen) total += c;
  CHECK(total == 768);
  CHECK_THROWS_AS(data::RASampler(255, 1, 0), UsageError);
  CHECK_THROWS_AS(data::RASampler(300, 2, 0, 0), UsageError);
  CHECK_THROWS_AS(data::RASampler(300, 2, 2), UsageError);
  CHECK_THROWS_WITH(data::RASampler(100, 2, 0), Catch::Contains("--ra-sampler"));
}

TEST_CASE("mixing flags: torchvision's spellings, off by default, bad values named", "[train][mixing]") {
  const auto plain = parse_cli({"--data", "x"}).train;
  CHECK(plain.mixup_alpha == 0.0);
  CHECK(plain.cutmix_alpha == 0.0);
  CHECK_FALSE(plain.ra_sampler);
  CHECK(plain.ra_reps == 3);
  const auto t = parse_cli({"--data", "x", "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0", "--ra-sampler",
                            "--ra-reps", "4"})
                     .train;
  CHECK(t.mixup_alpha == 0.2);
  CHECK(t.cutmix_alpha == 1.0);
  CHECK(t.ra_sampler);
  CHECK(t.ra_reps == 4);
  CHECK_THAT(usage_error({"--data", "x", "--mixup-alpha", "-0.1"}), Catch::Contains("--mixup-alpha"));
  CHECK_THAT(usage_error({"--data", "x", "--cutmix-alpha", "nan"}), Catch::Contains("--cutmix-alpha"));
  CHECK_THAT(usage_error({"--data", "x", "--ra-reps", "0"}), Catch::Contains("--ra-reps"));
}
