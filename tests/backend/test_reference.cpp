// The reference ops are the yardstick for every backend, so they are checked
// first: their backward passes against double-precision finite differences, and
// their PyTorch-specific rules (unbiased running variance, label smoothing,
// tie-breaking, optimizer bias correction) against values worked out by hand.
#include <catch2/catch.hpp>

#include <cmath>

#include "common/compare.h"
#include "common/gradcheck.h"
#include "reference/reference_ops.h"

using namespace rd;
using rd::test::check_gradient;
using rd::test::projection_weights;
using rd::test::to_double;
using rd::test::weighted_sum;

namespace {

ref::Act act_from(const std::vector<double>& v, int64_t n, int64_t c, int64_t h, int64_t w) {
  ref::Act a(n, c, h, w);
  a.v = v;
  return a;
}

#define REQUIRE_GRAD(what, result)   \
  do {                               \
    const auto r_ = (result);        \
    INFO(r_.summary(what));          \
    CHECK(r_.passed);                \
  } while (0)

}  // namespace

TEST_CASE("reference conv2d backward matches finite differences", "[reference]") {
  struct Case { int64_t n, ic, h, w, oc; int k, s, p, groups; };
  for (const Case c : {Case{1, 2, 5, 5, 3, 3, 1, 1, 1}, Case{2, 3, 7, 6, 2, 3, 2, 1, 1}, Case{2, 2, 6, 6, 4, 1, 2, 0, 1},
                       Case{1, 1, 9, 9, 2, 7, 2, 3, 1}, Case{2, 4, 5, 5, 6, 3, 1, 1, 2}, Case{1, 6, 6, 5, 3, 3, 2, 1, 3},
                       Case{2, 4, 4, 4, 4, 3, 1, 1, 4}}) {
    INFO("x[" << c.n << "," << c.ic << "," << c.h << "," << c.w << "] oc " << c.oc << " k" << c.k << " s" << c.s
              << " p" << c.p << " groups " << c.groups);
    const int g = c.groups;
    const auto x = to_double(test::random_floats(static_cast<size_t>(c.n * c.ic * c.h * c.w), 1));
    const auto w = to_double(test::random_floats(static_cast<size_t>(c.oc * (c.ic / g) * c.k * c.k), 2));
    const ref::Act y0 = ref::conv2d_forward(act_from(x, c.n, c.ic, c.h, c.w), w, c.oc, c.k, c.s, c.p, g);
    const auto proj = projection_weights(y0.size(), 3);
    const ref::Act dy = act_from(proj, y0.n, y0.c, y0.h, y0.w);
    auto loss_x = [&](const std::vector<double>& v) {
      return weighted_sum(ref::conv2d_forward(act_from(v, c.n, c.ic, c.h, c.w), w, c.oc, c.k, c.s, c.p, g).v, proj);
    };
    auto loss_w = [&](const std::vector<double>& v) {
      return weighted_sum(ref::conv2d_forward(act_from(x, c.n, c.ic, c.h, c.w), v, c.oc, c.k, c.s, c.p, g).v, proj);
    };
    REQUIRE_GRAD("conv dx", check_gradient<double>(
                                loss_x, x, ref::conv2d_backward_data(dy, w, c.ic, c.h, c.w, c.k, c.s, c.p, g).v));
    REQUIRE_GRAD("conv dw", check_gradient<double>(loss_w, w,
                                                   ref::conv2d_backward_weights(act_from(x, c.n, c.ic, c.h, c.w), dy,
                                                                                c.k, c.s, c.p, g)));
  }
}

TEST_CASE("reference grouped conv2d equals one dense conv2d per group", "[reference]") {
  // 2 groups of 3 input and 2 output channels: each group's output is the dense
  // convolution of its own input slice with its own weight slice.
  const int64_t n = 2, ic = 6, oc = 4, h = 5, w = 4;
  const auto xv = to_double(test::random_floats(static_cast<size_t>(n * ic * h * w), 5));
  const auto wv = to_double(test::random_floats(static_cast<size_t>(oc * 3 * 9), 6));
  const ref::Act xa = act_from(xv, n, ic, h, w);
  const ref::Act y = ref::conv2d_forward(xa, wv, oc, 3, 1, 1, 2);
  for (int64_t grp = 0; grp < 2; ++grp) {
    ref::Act xs(n, 3, h, w);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t i = 0; i < h; ++i)
          for (int64_t j = 0; j < w; ++j) xs.at(b, c, i, j) = xa.at(b, grp * 3 + c, i, j);
    const ref::Vec ws(wv.begin() + grp * 2 * 27, wv.begin() + (grp + 1) * 2 * 27);
    const ref::Act ys = ref::conv2d_forward(xs, ws, 2, 3, 1, 1);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t c = 0; c < 2; ++c)
        for (int64_t i = 0; i < h; ++i)
          for (int64_t j = 0; j < w; ++j) CHECK(y.at(b, grp * 2 + c, i, j) == ys.at(b, c, i, j));
  }
}

TEST_CASE("reference conv2d forward on a hand-computed example", "[reference]") {
  // 1 x 1 x 3 x 3 input 1..9, 3x3 kernel of ones, pad 1: each output is the sum of its neighbourhood.
  ref::Act x(1, 1, 3, 3);
  for (size_t i = 0; i < 9; ++i) x.v[i] = static_cast<double>(i + 1);
  const ref::Act y = ref::conv2d_forward(x, ref::Vec(9, 1.0), 1, 3, 1, 1);
  CHECK(y.v == ref::Vec{12, 21, 16, 27, 45, 33, 24, 39, 28});
  const ref::Act ys = ref::conv2d_forward(x, ref::Vec(9, 1.0), 1, 3, 2, 1);
  CHECK(ys.v == ref::Vec{12, 16, 24, 28});
}

TEST_CASE("reference batch norm backward matches finite differences", "[reference]") {
  for (bool relu : {false, true}) {
    const int64_t n = 2, c = 3, h = 3, w = 2;
    INFO("relu " << relu);
    // Separated values and beta = 0 keep the outputs away from the ReLU kink.
    auto x = to_double(test::separated_floats(static_cast<size_t>(n * c * h * w), 4, 0.1f, 0.1f));
    const ref::Vec gamma{1.2, -0.7, 0.9};
    const ref::Vec beta = relu ? ref::Vec{0.0, 0.0, 0.0} : ref::Vec{0.3, -0.2, 0.1};
    const auto proj = projection_weights(x.size(), 5);
    auto forward = [&](const ref::Vec& xv, const ref::Vec& g, const ref::Vec& b) {
      ref::Vec rm(3, 0.0), rv(3, 1.0);
      return ref::batchnorm_forward_train(act_from(xv, n, c, h, w), g, b, rm, rv, 0.1, 1e-5, relu).y.v;
    };
    const auto grads = ref::batchnorm_backward(act_from(x, n, c, h, w), act_from(proj, n, c, h, w), gamma, 1e-5,
                                               relu, beta);
    REQUIRE_GRAD("bn dx", check_gradient<double>(
                              [&](const ref::Vec& v) { return weighted_sum(forward(v, gamma, beta), proj); }, x,
                              grads.dx.v));
    REQUIRE_GRAD("bn dgamma", check_gradient<double>(
                                  [&](const ref::Vec& v) { return weighted_sum(forward(x, v, beta), proj); }, gamma,
                                  grads.dgamma));
    REQUIRE_GRAD("bn dbeta", check_gradient<double>(
                                 [&](const ref::Vec& v) { return weighted_sum(forward(x, gamma, v), proj); }, beta,
                                 grads.dbeta));
  }
}

TEST_CASE("reference batch norm statistics follow PyTorch", "[reference]") {
  // One channel holding 1, 2, 3, 4: mean 2.5, biased var 1.25 (normalisation),
  // unbiased var 5/3 (running_var), momentum 0.1 from running (0, 1).
  ref::Act x(2, 1, 1, 2);
  x.v = {1, 2, 3, 4};
  ref::Vec rm{0.0}, rv{1.0};
  const auto r = ref::batchnorm_forward_train(x, {1.0}, {0.0}, rm, rv, 0.1, 1e-5, false);
  CHECK(r.mean[0] == Approx(2.5));
  CHECK(r.invstd[0] == Approx(1.0 / std::sqrt(1.25 + 1e-5)));
  CHECK(rm[0] == Approx(0.25));
  CHECK(rv[0] == Approx(0.9 + 0.1 * 5.0 / 3.0));
  CHECK(r.y.v[0] == Approx(-1.5 / std::sqrt(1.25 + 1e-5)));
  const ref::Act ye = ref::batchnorm_forward_eval(x, {2.0}, {1.0}, rm, rv, 1e-5, true);
  CHECK(ye.v[0] == Approx(std::max(0.0, 2.0 * (1.0 - 0.25) / std::sqrt(rv[0] + 1e-5) + 1.0)));
}

TEST_CASE("reference elementwise, pooling and linear backward match finite differences", "[reference]") {
  const int64_t n = 2, c = 3, h = 5, w = 4;
  const auto x = to_double(test::separated_floats(static_cast<size_t>(n * c * h * w), 6));
  const auto b = to_double(test::separated_floats(x.size(), 7, 0.05f, 0.025f));
  SECTION("relu") {
    const auto proj = projection_weights(x.size(), 8);
    auto loss = [&](const ref::Vec& v) { return weighted_sum(ref::relu_forward(act_from(v, n, c, h, w)).v, proj); };
    const auto dx = ref::relu_backward(ref::relu_forward(act_from(x, n, c, h, w)), act_from(proj, n, c, h, w));
    REQUIRE_GRAD("relu", check_gradient<double>(loss, x, dx.v));
  }
  SECTION("add + relu") {
    const auto proj = projection_weights(x.size(), 9);
    auto loss = [&](const ref::Vec& v) {
      return weighted_sum(ref::add_forward(act_from(v, n, c, h, w), act_from(b, n, c, h, w), true).v, proj);
    };
    const ref::Act y = ref::add_forward(act_from(x, n, c, h, w), act_from(b, n, c, h, w), true);
    test::GradCheckOptions o;
    o.skip_kinks = true;
    REQUIRE_GRAD("add", check_gradient<double>(loss, x, ref::add_backward(y, act_from(proj, n, c, h, w), true).v, o));
  }
  SECTION("max pool 3x3/2 pad 1") {
    const ref::Act xa = act_from(x, n, c, h, w);
    const auto y = ref::maxpool_forward(xa, 3, 2, 1).y;
    const auto proj = projection_weights(y.size(), 10);
    auto loss = [&](const ref::Vec& v) { return weighted_sum(ref::maxpool_forward(act_from(v, n, c, h, w), 3, 2, 1).y.v, proj); };
    REQUIRE_GRAD("maxpool", check_gradient<double>(loss, x, ref::maxpool_backward(xa, act_from(proj, y.n, y.c, y.h, y.w), 3, 2, 1).v));
  }
  SECTION("global average pool") {
    const auto proj = projection_weights(static_cast<size_t>(n * c), 11);
    ref::Mat dy(n, c);
    dy.v = proj;
    auto loss = [&](const ref::Vec& v) { return weighted_sum(ref::global_avgpool_forward(act_from(v, n, c, h, w)).v, proj); };
    REQUIRE_GRAD("avgpool", check_gradient<double>(loss, x, ref::global_avgpool_backward(dy, h, w).v));
  }
  SECTION("linear") {
    ref::Mat xm(3, 5), wm(4, 5);
    xm.v = to_double(test::random_floats(15, 12));
    wm.v = to_double(test::random_floats(20, 13));
    const ref::Vec bias = to_double(test::random_floats(4, 14));
    const auto proj = projection_weights(12, 15);
    ref::Mat dy(3, 4);
    dy.v = proj;
    const auto g = ref::linear_backward(xm, wm, dy);
    auto loss_x = [&](const ref::Vec& v) { ref::Mat m = xm; m.v = v; return weighted_sum(ref::linear_forward(m, wm, bias).v, proj); };
    auto loss_w = [&](const ref::Vec& v) { ref::Mat m = wm; m.v = v; return weighted_sum(ref::linear_forward(xm, m, bias).v, proj); };
    auto loss_b = [&](const ref::Vec& v) { return weighted_sum(ref::linear_forward(xm, wm, v).v, proj); };
    REQUIRE_GRAD("linear dx", check_gradient<double>(loss_x, xm.v, g.dx.v));
    REQUIRE_GRAD("linear dw", check_gradient<double>(loss_w, wm.v, g.dw.v));
    REQUIRE_GRAD("linear db", check_gradient<double>(loss_b, bias, g.db));
  }
}

TEST_CASE("reference max pool: padding is -inf and the first maximum wins ties", "[reference]") {
  ref::Act x(1, 1, 2, 2);
  x.v = {-5, -3, -3, -4};
  const auto r = ref::maxpool_forward(x, 3, 2, 1);
  REQUIRE(r.y.size() == 1);
  CHECK(r.y.v[0] == -3.0);  // not the zero padding
  CHECK(r.argmax[0] == 1);  // two -3s: the first in window order
  ref::Act dy(1, 1, 1, 1);
  dy.v = {2.0};
  CHECK(ref::maxpool_backward(x, dy, 3, 2, 1).v == ref::Vec{0, 2, 0, 0});
}

TEST_CASE("reference label-smoothed cross-entropy follows PyTorch", "[reference]") {
  ref::Mat z(2, 3);
  z.v = {0, 0, 0, 1, 2, 3};
  const std::vector<int32_t> labels{1, 0};
  const auto r0 = ref::softmax_xent(z, labels, 0.0);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  CHECK(r0.mean_loss == Approx((std::log(3.0) + (lse - 1.0)) / 2.0));
  CHECK(r0.predictions == std::vector<int32_t>{0, 2});  // ties: first maximum
  const double s = 0.1;
  const auto rs = ref::softmax_xent(z, labels, s);
  const double row1 = (1 - s) * (lse - 1.0) + s * ((lse - 1.0) + (lse - 2.0) + (lse - 3.0)) / 3.0;
  CHECK(rs.mean_loss == Approx((std::log(3.0) + row1) / 2.0));
  auto loss = [&](const ref::Vec& v) { ref::Mat m = z; m.v = v; return ref::softmax_xent(m, labels, s).mean_loss; };
  REQUIRE_GRAD("xent", check_gradient<double>(loss, z.v, rs.dlogits.v));
}

TEST_CASE("reference Adam and SGD steps equal hand-computed values", "[reference]") {
  // Adam, p = 1, g = 0.5 twice, lr 0.1: bias correction makes m_hat = 0.5 and
  // v_hat = 0.25 at both steps, so each step moves p by lr * 0.5 / (0.5 + eps).
  ref::Vec p{1.0};
  ref::AdamState st;
  ref::adam_step(p, {0.5}, st, 0.1, 0.9, 0.999, 1e-8, 0.0);
  CHECK(p[0] == Approx(1.0 - 0.1 * 0.5 / (0.5 + 1e-8)).epsilon(1e-12));
  CHECK(st.m[0] == Approx(0.05));
  CHECK(st.v[0] == Approx(0.00025));
  ref::adam_step(p, {0.5}, st, 0.1, 0.9, 0.999, 1e-8, 0.0);
  CHECK(p[0] == Approx(0.8).epsilon(1e-7));
  // L2 weight decay adds wd * p to the gradient before the moments.
  ref::Vec q{2.0};
  ref::AdamState sq;
  ref::adam_step(q, {0.0}, sq, 0.1, 0.9, 0.999, 1e-8, 0.5);
  CHECK(sq.m[0] == Approx(0.1 * 1.0));
  CHECK(q[0] == Approx(2.0 - 0.1).epsilon(1e-7));

  // SGD momentum 0.9: the first step's buffer is the gradient itself.
  ref::Vec w{1.0};
  ref::SgdState ss;
  ref::sgd_step(w, {0.5}, ss, 0.1, 0.9, 0.0, 0.0, false);
  CHECK(w[0] == Approx(0.95));
  ref::sgd_step(w, {0.5}, ss, 0.1, 0.9, 0.0, 0.0, false);
  CHECK(ss.buf[0] == Approx(0.95));
  CHECK(w[0] == Approx(0.855));
  // Dampening 0.5 and weight decay 0.1, two steps from w = 1, g = 1: the first
  // buffer is the undamped d = 1.1, the second 0.9 * 1.1 + 0.5 * d2.
  ref::Vec u{1.0};
  ref::SgdState su;
  ref::sgd_step(u, {1.0}, su, 0.1, 0.9, 0.5, 0.1, false);
  CHECK(u[0] == Approx(1.0 - 0.1 * 1.1));
  const double u1 = u[0], d2 = 1.0 + 0.1 * u1, buf2 = 0.9 * 1.1 + 0.5 * d2;
  ref::sgd_step(u, {1.0}, su, 0.1, 0.9, 0.5, 0.1, false);
  CHECK(u[0] == Approx(u1 - 0.1 * buf2));
  // Nesterov (no dampening, as PyTorch requires): step = d + momentum * buf.
  ref::Vec t{1.0};
  ref::SgdState snes;
  ref::sgd_step(t, {1.0}, snes, 0.1, 0.9, 0.0, 0.0, true);
  CHECK(t[0] == Approx(1.0 - 0.1 * (1.0 + 0.9 * 1.0)));
  ref::sgd_step(t, {1.0}, snes, 0.1, 0.9, 0.0, 0.0, true);
  CHECK(t[0] == Approx(0.81 - 0.1 * (1.0 + 0.9 * 1.9)));
}
