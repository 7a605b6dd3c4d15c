// The per-element math in include/resnet_ddp/math/ is what both the CPU backend
// and the CUDA kernels run, so it is checked here on its own against the reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/compare.h"
#include "reference/reference_ops.h"
#include "resnet_ddp/math/activation.h"
#include "resnet_ddp/math/batchnorm.h"
#include "resnet_ddp/math/loss.h"
#include "resnet_ddp/math/optim.h"

using namespace rd;

TEST_CASE("math: relu and fused add-relu", "[math]") {
  CHECK(math::relu_forward(1.5f) == 1.5f);
  CHECK(math::relu_forward(-1.5f) == 0.f);
  CHECK(math::relu_forward(0.f) == 0.f);
  CHECK(math::relu_backward(2.f, 3.f) == 3.f);
  CHECK(math::relu_backward(0.f, 3.f) == 0.f);  // y == 0: no gradient (PyTorch threshold_backward)
  CHECK(math::add_relu_forward(1.f, -3.f) == 0.f);
  CHECK(math::add_relu_forward(1.f, 0.5f) == 1.5f);
}

TEST_CASE("math: batch-norm statistics, running update and backward", "[math]") {
  const int64_t n = 3, h = 4, w = 5;
  const auto xf = test::random_floats(static_cast<size_t>(n * h * w), 1, 1.f, 4.f);
  ref::Act x(n, 1, h, w);
  double sum = 0, sumsq = 0;
  for (size_t i = 0; i < xf.size(); ++i) {
    x.v[i] = xf[i];
    sum += xf[i];
    sumsq += static_cast<double>(xf[i]) * xf[i];
  }
  const double count = static_cast<double>(xf.size());
  float mean = 0, var = 0;
  math::bn_stats_from_sums(sum, sumsq, count, mean, var);
  const auto st = ref::batch_stats(x);
  CHECK(mean == Approx(st.mean[0]).epsilon(1e-6));
  CHECK(var == Approx(st.var[0]).epsilon(1e-5));
  float zero_mean = 1, zero_var = 1;  // rounding can make sumsq/n - mean^2 negative: clamp at 0
  math::bn_stats_from_sums(3.0, 3.0 - 1e-12, 3.0, zero_mean, zero_var);
  CHECK(zero_var == 0.f);

  float rm = 0.2f, rv = 0.8f;
  ref::Vec rrm{0.2}, rrv{0.8};
  math::bn_update_running(rm, rv, mean, var, count, 0.1f);
  ref::batchnorm_forward_train(x, {1.0}, {0.0}, rrm, rrv, 0.1, 1e-5, false);
  CHECK(rm == Approx(rrm[0]).epsilon(1e-6));
  CHECK(rv == Approx(rrv[0]).epsilon(1e-6));  // unbiased variance, as PyTorch

  const float eps = 1e-5f, invstd = math::bn_invstd(var, eps);
  CHECK(invstd == Approx(1.0 / std::sqrt(st.var[0] + 1e-5)).epsilon(1e-5));
  float scale = 0, shift = 0;
  const float gamma = -1.3f, beta = 0.4f;
  math::bn_scale_shift(gamma, beta, mean, invstd, scale, shift);
  const ref::Act y = ref::bn_normalize(x, {gamma}, {beta}, st.mean, st.var, 1e-5, false);
  for (size_t i = 0; i < xf.size(); ++i) CHECK(xf[i] * scale + shift == Approx(y.v[i]).epsilon(1e-5).margin(1e-5));

  const auto dyf = test::random_floats(xf.size(), 2);
  ref::Act dy(n, 1, h, w);
  double sum_dy = 0, sum_dy_xhat = 0;
  for (size_t i = 0; i < xf.size(); ++i) {
    dy.v[i] = dyf[i];
    sum_dy += dyf[i];
    sum_dy_xhat += dyf[i] * (xf[i] - mean) * invstd;
  }
  const auto g = ref::batchnorm_backward(x, dy, {gamma}, 1e-5, false, {beta});
  for (size_t i = 0; i < xf.size(); ++i) {
    const float dx = math::bn_backward_dx(dyf[i], xf[i], mean, invstd, gamma, static_cast<float>(sum_dy / count),
                                          static_cast<float>(sum_dy_xhat / count));
    CHECK(dx == Approx(g.dx.v[i]).epsilon(1e-4).margin(1e-5));
    // The CPU backend's affine form of the same formula.
    float k, p, q;
    math::bn_backward_coefficients(gamma, mean, invstd, sum_dy / count, sum_dy_xhat / count, k, p, q);
    CHECK(math::bn_backward_dx_affine(dyf[i], xf[i], k, p, q) == Approx(g.dx.v[i]).epsilon(1e-4).margin(1e-5));
  }
}

TEST_CASE("math: label-smoothed softmax cross-entropy row", "[math]") {
  const int K = 7, N = 5;
  auto zf = test::random_floats(static_cast<size_t>(N * K), 3, -4.f, 4.f);
  zf[2] = 90.f;  // exp(90) overflows float: the row must still be finite
  ref::Mat z(N, K);
  for (size_t i = 0; i < zf.size(); ++i) z.v[i] = zf[i];
  std::vector<int32_t> labels{0, 6, 3, 3, 1};
  for (float s : {0.f, 0.1f, 0.3f}) {
    INFO("smoothing " << s);
    const auto r = ref::softmax_xent(z, labels, s);
    double total = 0;
    for (int i = 0; i < N; ++i) {
      float dz[K];
      int amax = -1;
      const float grad_scale = 0.25f;
      total += math::softmax_xent_row(&zf[static_cast<size_t>(i * K)], K, labels[static_cast<size_t>(i)], s,
                                      grad_scale, dz, &amax);
      CHECK(amax == r.predictions[static_cast<size_t>(i)]);
      for (int k = 0; k < K; ++k)  // per row: d loss_row / dz = N * d mean / dz
        CHECK(dz[k] == Approx(r.dlogits.at(i, k) * N * grad_scale).margin(1e-6));
    }
    CHECK(total / N == Approx(r.mean_loss).epsilon(1e-6));
  }
}

TEST_CASE("math: Adam and SGD element updates follow torch.optim", "[math]") {
  const size_t count = 33;
  const auto p0 = test::random_floats(count, 4);
  for (float wd : {0.f, 0.05f}) {
    INFO("adam weight decay " << wd);
    std::vector<float> p = p0, m(count, 0.f), v(count, 0.f);
    ref::Vec pr = test::to_double(p0);
    ref::AdamState st;
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    for (int step = 1; step <= 4; ++step) {
      const auto g = test::random_floats(count, 10 + static_cast<uint64_t>(step));
      const math::AdamHyper hp{lr, b1, b2, eps, wd, 1.f - std::pow(b1, static_cast<float>(step)),
                               std::sqrt(1.f - std::pow(b2, static_cast<float>(step)))};
      for (size_t i = 0; i < count; ++i) math::adam_update(p[i], g[i], m[i], v[i], hp);
      ref::adam_step(pr, test::to_double(g), st, lr, b1, b2, eps, wd);
    }
    const auto rep = test::compare_close(p, pr, test::Tol{1e-5, 1e-6});
    INFO(rep.str());
    CHECK(rep.ok);
  }
  for (bool nesterov : {false, true})
    for (float damp : {0.f, 0.2f}) {
      if (nesterov && damp != 0.f) continue;  // PyTorch forbids Nesterov with dampening
      INFO("sgd nesterov " << nesterov << " dampening " << damp);
      std::vector<float> p = p0, buf(count, 555.f);
      ref::Vec pr = test::to_double(p0);
      ref::SgdState st;
      for (int step = 1; step <= 3; ++step) {
        const auto g = test::random_floats(count, 20 + static_cast<uint64_t>(step));
        const math::SgdHyper hp{0.1f, 0.9f, damp, 1e-3f, nesterov, step == 1, nullptr};
        for (size_t i = 0; i < count; ++i) math::sgd_update(p[i], g[i], buf[i], hp);
        ref::sgd_step(pr, test::to_double(g), st, 0.1, 0.9, damp, 1e-3, nesterov);
      }
      const auto rep = test::compare_close(p, pr, test::Tol{1e-5, 1e-6});
      INFO(rep.str());
      CHECK(rep.ok);
      CHECK(test::compare_close(buf, st.buf, test::Tol{1e-5, 1e-6}).ok);
    }
}
