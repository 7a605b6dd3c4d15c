// Optimizers over the flat arena, against PyTorch 1.13's numbers (schedulers: test_scheduler.cpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/train/optimizer.h"
#include "train/train_test_util.h"

using namespace rd;
using namespace rd::train;
using rd::test::host;

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
