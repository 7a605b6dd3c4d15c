// LR schedulers and optimizers over the flat arena, against PyTorch 1.13's numbers.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/train/optimizer.h"
#include "train/train_test_util.h"

using namespace rd;
using namespace rd::train;
using rd::test::host;

TEST_CASE("ReduceLROnPlateau matches torch 1.13", "[train]") {
  // lr after each step(loss), from torch.optim.lr_scheduler.ReduceLROnPlateau(Adam(lr=1e-4),
  // mode='min', factor=0.1, patience=5, min_lr=1e-8) on these losses (torch 1.13.1).
  const std::vector<double> losses = {1.0, 0.9, 0.95, 0.9, 0.8999, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.5, 0.6, 0.6, 0.6,
                                      0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  const std::vector<double> torch_lr = {
      0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001,
      1e-05, 1e-05, 1e-05, 1e-05, 1e-05, 1e-05, 1e-05, 1.0000000000000002e-06, 1.0000000000000002e-06,
      1.0000000000000002e-06, 1.0000000000000002e-06, 1.0000000000000002e-06, 1.0000000000000002e-06,
      1.0000000000000002e-07, 1.0000000000000002e-07, 1.0000000000000002e-07, 1.0000000000000002e-07,
      1.0000000000000002e-07, 1.0000000000000002e-07, 1.0000000000000004e-08};
  Scheduler s(SchedulerKind::Plateau, 1e-4, 5);
  double lr = 1e-4;
  for (size_t i = 0; i < losses.size(); ++i) {
    lr = s.step(lr, losses[i]);
    INFO("step " << i + 1);
    CHECK(lr == torch_lr[i]);
  }
  // min_lr is a floor and changes smaller than eps are not applied.
  for (int i = 0; i < 20; ++i) lr = s.step(lr, 0.6);
  CHECK(lr == Approx(1e-8).epsilon(1e-6));
}

TEST_CASE("CosineAnnealingLR matches torch 1.13", "[train]") {
  // CosineAnnealingLR(Adam(lr=0.1), T_max=5), lr after each step (torch 1.13.1),
  // including the restart beyond T_max.
  const std::vector<double> torch_lr = {0.09045084971874738, 0.06545084971874737, 0.03454915028125263,
                                        0.009549150281252633, 0.0, 0.009549150281252628, 0.03454915028125265,
                                        0.06545084971874741, 0.09045084971874744, 0.10000000000000006,
                                        0.09045084971874746, 0.06545084971874743};
  Scheduler s(SchedulerKind::Cosine, 0.1, 5);
  double lr = 0.1;
  for (size_t i = 0; i < torch_lr.size(); ++i) {
    lr = s.step(lr, 0.0);
    INFO("step " << i + 1);
    CHECK(lr == Approx(torch_lr[i]).margin(1e-15));
  }
  Scheduler none(SchedulerKind::None, 0.1, 5);
  CHECK(none.step(0.1, 1.0) == 0.1);
}

TEST_CASE("Adam and SGD over the flat arena follow PyTorch's update", "[train]") {
  auto be = make_cpu_backend({});
  Arena params, grads;
  params.add("a", Shape{3});
  params.add("b", Shape{2, 2});
  grads.add("a", Shape{3});
  grads.add("b", Shape{2, 2});
  params.allocate(*be);
  grads.allocate(*be);
  std::vector<float> p0 = {0.5f, -1.f, 2.f, 0.1f, 0.2f, -0.3f, 0.4f};

  auto load = [&](const std::vector<float>& v, Arena& a) {
    be->copy_from_host(a.ptr(0), v.data(), 3 * sizeof(float));
    be->copy_from_host(a.ptr(1), v.data() + 3, 4 * sizeof(float));
  };
  auto read = [&](Arena& a) {
    std::vector<float> v = host(*be, a.ptr(0), 3), w = host(*be, a.ptr(1), 4);
    v.insert(v.end(), w.begin(), w.end());
    return v;
  };
  const std::vector<std::vector<float>> g = {{0.1f, -0.2f, 0.3f, 0.05f, 0.0f, -0.4f, 1.0f},
                                             {-0.3f, 0.1f, 0.2f, 0.5f, 0.25f, 0.1f, -1.0f},
                                             {0.2f, 0.2f, -0.1f, -0.05f, 0.3f, 0.2f, 0.5f}};

  SECTION("adam with weight decay") {
    load(p0, params);
    OptimizerConfig cfg;
    cfg.lr = 0.01;
    cfg.weight_decay = 0.1;
    Optimizer opt(*be, params, grads, cfg);
    std::vector<double> p(p0.begin(), p0.end()), m(7, 0.0), v(7, 0.0);
    for (int t = 1; t <= 3; ++t) {
      load(g[static_cast<size_t>(t - 1)], grads);
      opt.step();
      for (size_t i = 0; i < 7; ++i) {
        const double gi = g[static_cast<size_t>(t - 1)][i] + 0.1 * p[i];
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.999 * v[i] + 0.001 * gi * gi;
        const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(0.999, t)) + 1e-8;
        p[i] -= 0.01 / (1 - std::pow(0.9, t)) * m[i] / denom;
      }
    }
    CHECK(opt.steps() == 3);
    std::vector<float> got = read(params);
    for (size_t i = 0; i < 7; ++i) CHECK(got[i] == Approx(p[i]).epsilon(1e-5));
  }
  SECTION("sgd with momentum seeds the buffer with the first gradient") {
    load(p0, params);
    OptimizerConfig cfg;
    cfg.type = OptimizerKind::Sgd;
    cfg.lr = 0.1;
    cfg.momentum = 0.9;
    Optimizer opt(*be, params, grads, cfg);
    REQUIRE(opt.state_count() == 1);
    std::vector<double> p(p0.begin(), p0.end()), buf(7, 0.0);
    for (int t = 1; t <= 3; ++t) {
      load(g[static_cast<size_t>(t - 1)], grads);
      opt.step();
      for (size_t i = 0; i < 7; ++i) {
        const double gi = g[static_cast<size_t>(t - 1)][i];
        buf[i] = t == 1 ? gi : 0.9 * buf[i] + gi;
        p[i] -= 0.1 * buf[i];
      }
    }
    std::vector<float> got = read(params);
    for (size_t i = 0; i < 7; ++i) CHECK(got[i] == Approx(p[i]).epsilon(1e-5));
  }
}
