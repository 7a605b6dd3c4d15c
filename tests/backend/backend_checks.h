// One check function per backend op, each taking any rd::Backend: it moves
// data in and out only through the backend's own copy functions, compares
// forward and backward with the float64 reference (tests/reference) and with
// central finite differences (tests/common/gradcheck.h), and checks that
// `accumulate=true` adds while `false` overwrites. tests/backend runs them on the
// CPU backend in every layout it supports; tests/gpu reuses them for CUDA
// (pass a looser Tol for TF32).
#pragma once

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/gradcheck.h"
#include "reference/reference_ops.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"

#define RD_CHECK_CLOSE(what, got, expected, tol)                           \
  do {                                                                     \
    const auto rd_close_ = ::rd::test::compare_close((got), (expected), (tol)); \
    INFO(what << ": " << rd_close_.str());                                 \
    CHECK(rd_close_.ok);                                                   \
  } while (0)

#define RD_CHECK_GRADIENT(what, result)      \
  do {                                       \
    const auto rd_grad_ = (result);          \
    INFO(rd_grad_.summary(what));            \
    CHECK(rd_grad_.passed);                  \
  } while (0)

namespace rd::test {

// ---- moving data through the backend ---------------------------------------------

// A flat float buffer on the backend's device (per-channel vectors, optimizer state).
struct DeviceVector {
  Backend* backend = nullptr;
  std::shared_ptr<void> memory;
  size_t count = 0;

  DeviceVector(Backend& be, const std::vector<float>& host)
      : backend(&be), memory(be.allocate(std::max<size_t>(host.size(), 1) * sizeof(float))),
        count(host.size()) {
    if (count) be.copy_from_host(memory.get(), host.data(), count * sizeof(float));
  }
  float* ptr() { return static_cast<float*>(memory.get()); }
  std::vector<float> host() const {
    std::vector<float> h(count);
    if (count) backend->copy_to_host(h.data(), memory.get(), count * sizeof(float));
    return h;
  }
};

inline Tensor upload_activation(Backend& be, const std::vector<float>& nchw, int64_t n, int64_t c,
                                int64_t h, int64_t w) {
  Tensor t = be.activation(n, c, h, w);
  be.copy_from_host_nchw(nchw.data(), t);
  return t;
}

inline std::vector<float> download_activation(Backend& be, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  be.copy_to_host_nchw(t, h.data());
  return h;
}

inline Tensor upload_rowmajor(Backend& be, const std::vector<float>& host, const Shape& shape) {
  Tensor t = be.tensor(shape, Layout::RowMajor);
  be.copy_from_host(t.data, host.data(), host.size() * sizeof(float));
  return t;
}

inline std::vector<float> download_rowmajor(Backend& be, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  be.copy_to_host(h.data(), t.data, h.size() * sizeof(float));
  return h;
}

inline ref::Act to_act(const std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w) {
  ref::Act a(n, c, h, w);
  for (size_t i = 0; i < v.size(); ++i) a.v[i] = v[i];
  return a;
}

inline ref::Mat to_mat(const std::vector<float>& v, int64_t rows, int64_t cols) {
  ref::Mat m(rows, cols);
  for (size_t i = 0; i < v.size(); ++i) m.v[i] = v[i];
  return m;
}

inline std::vector<float> filled(size_t n, float value) { return std::vector<float>(n, value); }

// Expected result of an accumulating gradient write: prior + fresh.
inline std::vector<double> plus(const std::vector<float>& prior, const std::vector<double>& fresh) {
  std::vector<double> r(fresh.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<double>(prior[i]) + fresh[i];
  return r;
}

// Finite-difference settings for float backends: a loss sum over a few hundred
// outputs carries ~1e-5 relative rounding noise, so the step stays >= 1e-3.
inline GradCheckOptions float_fd(size_t samples, uint64_t seed, double step = 1e-2) {
  GradCheckOptions o;
  o.step = step;
  o.threshold = 1e-2;
  o.max_checks = samples;
  o.seed = seed;
  return o;
}

// ---- convolution ---------------------------------------------------------------------

struct ConvCase {
  int64_t n, in_c, h, w, out_c;
  int kernel, stride, pad;
  int groups = 1;
  std::string str() const {
    std::ostringstream os;
    os << "conv x[" << n << "," << in_c << "," << h << "," << w << "] -> " << out_c << " k" << kernel
       << " s" << stride << " p" << pad << " g" << groups;
    return os.str();
  }
};

inline void check_conv2d(Backend& be, const ConvCase& c, Tol tol = {}, bool finite_differences = true) {
  INFO(c.str() << " on " << be.name() << " layout " << layout_name(be.activation_layout()));
  const ConvGeometry g{c.kernel, c.stride, c.pad, c.groups};
  const int64_t oh = conv_out_size(c.h, c.kernel, c.stride, c.pad);
  const int64_t ow = conv_out_size(c.w, c.kernel, c.stride, c.pad);
  const Shape wshape{c.out_c, c.in_c / c.groups, c.kernel, c.kernel};
  const auto xh = random_floats(static_cast<size_t>(c.n * c.in_c * c.h * c.w), 11);
  const auto wh = random_floats(static_cast<size_t>(wshape.numel()), 12);
  const auto dyh = to_float(projection_weights(static_cast<size_t>(c.n * c.out_c * oh * ow), 13));
  const ref::Act xr = to_act(xh, c.n, c.in_c, c.h, c.w);
  const ref::Act dyr = to_act(dyh, c.n, c.out_c, oh, ow);
  const ref::Vec wr = to_double(wh);

  Tensor x = upload_activation(be, xh, c.n, c.in_c, c.h, c.w);
  Tensor w = upload_rowmajor(be, wh, wshape);
  Tensor y = be.activation(c.n, c.out_c, oh, ow);
  be.copy_from_host_nchw(filled(static_cast<size_t>(y.numel()), 123.f).data(), y);
  be.conv2d_forward(x, w, y, g);
  const ref::Act yr = ref::conv2d_forward(xr, wr, c.out_c, c.kernel, c.stride, c.pad, c.groups);
  RD_CHECK_CLOSE("conv forward y", download_activation(be, y), yr.v, tol);

  Tensor dy = upload_activation(be, dyh, c.n, c.out_c, oh, ow);
  Tensor dx = be.activation(c.n, c.in_c, c.h, c.w);
  be.copy_from_host_nchw(filled(static_cast<size_t>(dx.numel()), 123.f).data(), dx);
  be.conv2d_backward_data(dy, w, dx, g);
  const ref::Act dxr = ref::conv2d_backward_data(dyr, wr, c.in_c, c.h, c.w, c.kernel, c.stride, c.pad, c.groups);
  RD_CHECK_CLOSE("conv backward dx", download_activation(be, dx), dxr.v, tol);

  const ref::Vec dwr = ref::conv2d_backward_weights(xr, dyr, c.kernel, c.stride, c.pad, c.groups);
  Tensor dw = upload_rowmajor(be, filled(wh.size(), 123.f), wshape);
  be.conv2d_backward_weights(x, dy, dw, g, /*accumulate=*/false);
  RD_CHECK_CLOSE("conv backward dw (overwrite)", download_rowmajor(be, dw), dwr, tol);
  const auto prior = random_floats(wh.size(), 14);
  be.copy_from_host(dw.data, prior.data(), prior.size() * sizeof(float));
  be.conv2d_backward_weights(x, dy, dw, g, /*accumulate=*/true);
  RD_CHECK_CLOSE("conv backward dw (accumulate)", download_rowmajor(be, dw), plus(prior, dwr), tol);

  if (!finite_differences) return;
  const auto proj = to_double(dyh);  // loss = sum(dy * y), so dloss/dy = dy
  auto loss_of_x = [&](const std::vector<float>& xv) {
    Tensor xt = upload_activation(be, xv, c.n, c.in_c, c.h, c.w);
    be.conv2d_forward(xt, w, y, g);
    return weighted_sum(download_activation(be, y), proj);
  };
  RD_CHECK_GRADIENT("conv dx vs finite differences",
                    check_gradient<float>(loss_of_x, xh, to_double(download_activation(be, dx)),
                                          float_fd(16, 1)));
  const auto dw_fresh = download_rowmajor(be, dw);
  std::vector<double> dw_only(dw_fresh.size());
  for (size_t i = 0; i < dw_only.size(); ++i) dw_only[i] = dw_fresh[i] - static_cast<double>(prior[i]);
  auto loss_of_w = [&](const std::vector<float>& wv) {
    Tensor wt = upload_rowmajor(be, wv, wshape);
    be.conv2d_forward(x, wt, y, g);
    return weighted_sum(download_activation(be, y), proj);
  };
  RD_CHECK_GRADIENT("conv dw vs finite differences",
                    check_gradient<float>(loss_of_w, wh, to_double(to_float(dw_only)), float_fd(16, 2)));
}

// ---- batch norm --------------------------------------------------------------------------

struct BnCase {
  int64_t n, c, h, w;
  bool relu;
  std::string str() const {
    std::ostringstream os;
    os << "batchnorm x[" << n << "," << c << "," << h << "," << w << "]" << (relu ? " +relu" : "");
    return os.str();
  }
};

// Per-channel inputs for finite differences through a fused ReLU: symmetric,
// well-separated values, so with beta = 0 no output sits near the kink.
inline std::vector<float> bn_kink_free_input(const BnCase& c, uint64_t seed) {
  const size_t per_channel = static_cast<size_t>(c.n * c.h * c.w);
  std::vector<float> x(static_cast<size_t>(c.n * c.c * c.h * c.w));
  for (int64_t ch = 0; ch < c.c; ++ch) {
    const auto vals = separated_floats(per_channel, seed + static_cast<uint64_t>(ch), 0.1f, 0.1f);
    const float shift = 0.3f * static_cast<float>(ch % 3) - 0.3f;  // non-zero channel means too
    size_t k = 0;
    for (int64_t n = 0; n < c.n; ++n)
      for (int64_t i = 0; i < c.h * c.w; ++i)
        x[static_cast<size_t>((n * c.c + ch) * c.h * c.w + i)] = vals[k++] + shift;
  }
  return x;
}

// data[i] *= factor for doubles in the backend's memory (test reducers; through
// the host, since the backend has no double kernels).
inline void scale_device_doubles(Backend& be, double* data, size_t count, double factor) {
  std::vector<double> h(count);
  be.copy_to_host(h.data(), data, count * sizeof(double));
  for (double& v : h) v *= factor;
  be.copy_from_host(data, h.data(), count * sizeof(double));
}

// The BatchNormArgs / BatchNormGrads the batch-norm ops take, from test vectors.
inline BatchNormArgs bn_args(const float* gamma, const float* beta, float* running_mean, float* running_var,
                             float momentum, float eps, bool relu, ChannelReducer* sync = nullptr) {
  BatchNormArgs a;
  a.gamma = gamma, a.beta = beta, a.running_mean = running_mean, a.running_var = running_var;
  a.momentum = momentum, a.eps = eps, a.relu = relu, a.sync = sync;
  return a;
}
inline BatchNormGrads bn_grads(float* dgamma, float* dbeta, bool accumulate) {
  BatchNormGrads g;
  g.dgamma = dgamma, g.dbeta = dbeta, g.accumulate = accumulate;
  return g;
}

inline void check_batchnorm(Backend& be, const BnCase& c, Tol tol = {}, bool finite_differences = true) {
  INFO(c.str() << " on " << be.name() << " layout " << layout_name(be.activation_layout()));
  const size_t C = static_cast<size_t>(c.c);
  const double count = static_cast<double>(c.n * c.h * c.w);
  const float momentum = 0.1f, eps = 1e-5f;
  auto xh = random_floats(static_cast<size_t>(c.n * c.c * c.h * c.w), 21, -2.f, 3.f);
  auto gh = random_floats(C, 22, 0.5f, 1.5f);
  for (size_t i = 1; i < C; i += 3) gh[i] = -gh[i];  // negative scales flip the ReLU mask
  const auto bh = random_floats(C, 23, -0.5f, 0.5f);
  const auto rm0 = random_floats(C, 24, -0.5f, 0.5f);
  const auto rv0 = random_floats(C, 25, 0.5f, 1.5f);
  const auto dyh = to_float(projection_weights(xh.size(), 26));

  Tensor x = upload_activation(be, xh, c.n, c.c, c.h, c.w);
  DeviceVector gamma(be, gh), beta(be, bh), rmean(be, rm0), rvar(be, rv0);
  DeviceVector saved_mean(be, filled(C, 0.f)), saved_invstd(be, filled(C, 0.f));
  BatchNormSaved saved;
  saved.mean = saved_mean.ptr();
  saved.invstd = saved_invstd.ptr();
  Tensor y = be.activation(c.n, c.c, c.h, c.w);
  be.batchnorm_forward_train(x, bn_args(gamma.ptr(), beta.ptr(), rmean.ptr(), rvar.ptr(), momentum, eps, c.relu),
                             y, saved);

  // The reference starts from the values as stored: under bf16/fp16 the upload
  // rounds x, and an element near the fused ReLU's kink can change sides
  // and flip its gradient. For f32 activations this is xh itself.
  ref::Vec rm = to_double(rm0), rv = to_double(rv0);
  const auto xs = download_activation(be, x);
  const ref::Act xr = to_act(xs, c.n, c.c, c.h, c.w);
  const auto fr = ref::batchnorm_forward_train(xr, to_double(gh), to_double(bh), rm, rv, momentum,
                                               eps, c.relu);
  RD_CHECK_CLOSE("bn train forward y", download_activation(be, y), fr.y.v, tol);
  RD_CHECK_CLOSE("bn saved mean", saved_mean.host(), fr.mean, tol);
  RD_CHECK_CLOSE("bn saved invstd", saved_invstd.host(), fr.invstd, tol);
  RD_CHECK_CLOSE("bn running_mean", rmean.host(), rm, tol);
  RD_CHECK_CLOSE("bn running_var (unbiased)", rvar.host(), rv, tol);
  CHECK(saved.count == Approx(count));

  // Backward: overwrite, then accumulate into dgamma/dbeta.
  Tensor dy = upload_activation(be, dyh, c.n, c.c, c.h, c.w);
  Tensor dx = be.activation(c.n, c.c, c.h, c.w);
  be.copy_from_host_nchw(filled(xh.size(), 123.f).data(), dx);
  DeviceVector dgamma(be, filled(C, 123.f)), dbeta(be, filled(C, 123.f));
  be.batchnorm_backward(x, y, dy, bn_args(gamma.ptr(), beta.ptr(), rmean.ptr(), rvar.ptr(), momentum, eps, c.relu),
                        saved, dx, bn_grads(dgamma.ptr(), dbeta.ptr(), /*accumulate=*/false));
  const auto dys = download_activation(be, dy);
  const auto gr = ref::batchnorm_backward(xr, to_act(dys, c.n, c.c, c.h, c.w), to_double(gh), eps,
                                          c.relu, to_double(bh));
  const auto dx_backend = download_activation(be, dx);
  RD_CHECK_CLOSE("bn backward dx", dx_backend, gr.dx.v, tol);
  RD_CHECK_CLOSE("bn backward dgamma", dgamma.host(), gr.dgamma, tol);
  RD_CHECK_CLOSE("bn backward dbeta", dbeta.host(), gr.dbeta, tol);
  const auto prior_g = random_floats(C, 27), prior_b = random_floats(C, 28);
  be.copy_from_host(dgamma.ptr(), prior_g.data(), C * sizeof(float));
  be.copy_from_host(dbeta.ptr(), prior_b.data(), C * sizeof(float));
  be.batchnorm_backward(x, y, dy, bn_args(gamma.ptr(), beta.ptr(), rmean.ptr(), rvar.ptr(), momentum, eps, c.relu),
                        saved, dx, bn_grads(dgamma.ptr(), dbeta.ptr(), /*accumulate=*/true));
  RD_CHECK_CLOSE("bn backward dgamma (accumulate)", dgamma.host(), plus(prior_g, gr.dgamma), tol);
  RD_CHECK_CLOSE("bn backward dbeta (accumulate)", dbeta.host(), plus(prior_b, gr.dbeta), tol);

  // Eval mode normalises with the running statistics the train step just wrote.
  Tensor ye = be.activation(c.n, c.c, c.h, c.w);
  be.batchnorm_forward_eval(x, bn_args(gamma.ptr(), beta.ptr(), rmean.ptr(), rvar.ptr(), momentum, eps, c.relu), ye);
  const ref::Act yer = ref::batchnorm_forward_eval(xr, to_double(gh), to_double(bh), rm, rv, eps, c.relu);
  RD_CHECK_CLOSE("bn eval forward y (running stats)", download_activation(be, ye), yer.v, tol);

  if (!finite_differences) return;
  // Kink-free input and beta = 0 when ReLU is fused (see bn_kink_free_input).
  const auto xf = c.relu ? bn_kink_free_input(c, 29) : xh;
  const auto bf = c.relu ? filled(C, 0.f) : bh;
  const auto proj = to_double(dyh);
  DeviceVector scratch_rm(be, rm0), scratch_rv(be, rv0), beta_f(be, bf);
  auto forward_loss = [&](const std::vector<float>& xv, const std::vector<float>& gv,
                          const std::vector<float>& bv) {
    Tensor xt = upload_activation(be, xv, c.n, c.c, c.h, c.w);
    DeviceVector g(be, gv), b(be, bv);
    BatchNormSaved s;
    s.mean = saved_mean.ptr();
    s.invstd = saved_invstd.ptr();
    be.batchnorm_forward_train(xt, bn_args(g.ptr(), b.ptr(), scratch_rm.ptr(), scratch_rv.ptr(), momentum, eps, c.relu),
                               y, s);
    return weighted_sum(download_activation(be, y), proj);
  };
  // Analytic gradients at the finite-difference point.
  Tensor xt = upload_activation(be, xf, c.n, c.c, c.h, c.w);
  const BatchNormArgs fd_args =
      bn_args(gamma.ptr(), beta_f.ptr(), scratch_rm.ptr(), scratch_rv.ptr(), momentum, eps, c.relu);
  be.batchnorm_forward_train(xt, fd_args, y, saved);
  be.batchnorm_backward(xt, y, dy, fd_args, saved, dx, bn_grads(dgamma.ptr(), dbeta.ptr(), false));
  const auto dxa = to_double(download_activation(be, dx));
  const auto dga = to_double(dgamma.host()), dba = to_double(dbeta.host());
  RD_CHECK_GRADIENT("bn dx vs finite differences",
                    check_gradient<float>([&](const std::vector<float>& v) { return forward_loss(v, gh, bf); },
                                          xf, dxa, float_fd(16, 3, 1e-3)));
  RD_CHECK_GRADIENT("bn dgamma vs finite differences",
                    check_gradient<float>([&](const std::vector<float>& v) { return forward_loss(xf, v, bf); },
                                          gh, dga, float_fd(0, 4, 1e-3)));
  RD_CHECK_GRADIENT("bn dbeta vs finite differences",
                    check_gradient<float>([&](const std::vector<float>& v) { return forward_loss(xf, gh, v); },
                                          bf, dba, float_fd(0, 5, 1e-3)));
}

// Several training steps in a row: the running statistics follow PyTorch's
// momentum rule step after step (as in a model's BN layer).
inline void check_batchnorm_running_stats(Backend& be, const BnCase& c, int steps, Tol tol = {}) {
  INFO(c.str() << " x" << steps << " steps on " << be.name());
  const size_t C = static_cast<size_t>(c.c);
  const auto gh = random_floats(C, 31, 0.5f, 1.5f), bh = random_floats(C, 32);
  DeviceVector gamma(be, gh), beta(be, bh), rmean(be, filled(C, 0.f)), rvar(be, filled(C, 1.f));
  DeviceVector sm(be, filled(C, 0.f)), si(be, filled(C, 0.f));
  ref::Vec rm(C, 0.0), rv(C, 1.0);
  Tensor y = be.activation(c.n, c.c, c.h, c.w);
  for (int s = 0; s < steps; ++s) {
    const auto xh = random_floats(static_cast<size_t>(c.n * c.c * c.h * c.w), 40 + static_cast<uint64_t>(s),
                                  -1.f + static_cast<float>(s), 2.f + 2.f * static_cast<float>(s));
    Tensor x = upload_activation(be, xh, c.n, c.c, c.h, c.w);
    BatchNormSaved saved;
    saved.mean = sm.ptr();
    saved.invstd = si.ptr();
    be.batchnorm_forward_train(x, bn_args(gamma.ptr(), beta.ptr(), rmean.ptr(), rvar.ptr(), 0.1f, 1e-5f, c.relu), y,
                               saved);
    ref::batchnorm_forward_train(to_act(download_activation(be, x), c.n, c.c, c.h, c.w), to_double(gh), to_double(bh), rm, rv,
                                 0.1, 1e-5, c.relu);
  }
  RD_CHECK_CLOSE("running_mean after steps", rmean.host(), rm, tol);
  RD_CHECK_CLOSE("running_var after steps", rvar.host(), rv, tol);
}

// SyncBatchNorm seam: a reducer standing for `replicas` ranks that all hold this
// very batch (it multiplies every per-channel sum by the rank count). The result
// must equal batch norm over the batch repeated `replicas` times: the same y and
// dx, running_var unbiased with the global count, saved.count global, and
// dgamma/dbeta this rank's own share (DDP averages them later).
struct ReplicaReducer : ChannelReducer {
  Backend* backend;
  int replicas;
  int calls = 0;
  ReplicaReducer(Backend& be, int r) : backend(&be), replicas(r) {}
  void allreduce_sum(double* data, size_t count) override {
    ++calls;
    scale_device_doubles(*backend, data, count, static_cast<double>(replicas));
  }
  int participants() const override { return replicas; }
};

inline void check_batchnorm_sync(Backend& be, const BnCase& c, int replicas, Tol tol = {}) {
  INFO(c.str() << " synchronised over " << replicas << " identical ranks on " << be.name() << " layout "
                << layout_name(be.activation_layout()));
  const size_t C = static_cast<size_t>(c.c), n_local = static_cast<size_t>(c.n * c.c * c.h * c.w);
  const auto xh = random_floats(n_local, 161, -1.f, 2.f);
  const auto gh = random_floats(C, 162, 0.5f, 1.5f), bh = random_floats(C, 163);
  const auto dyh = to_float(projection_weights(n_local, 164));
  DeviceVector gamma(be, gh), beta(be, bh), rmean(be, filled(C, 0.f)), rvar(be, filled(C, 1.f));
  DeviceVector sm(be, filled(C, 0.f)), si(be, filled(C, 0.f)), dgamma(be, filled(C, 0.f)), dbeta(be, filled(C, 0.f));
  BatchNormSaved saved;
  saved.mean = sm.ptr();
  saved.invstd = si.ptr();
  Tensor x = upload_activation(be, xh, c.n, c.c, c.h, c.w);
  Tensor y = be.activation(c.n, c.c, c.h, c.w);
  ReplicaReducer reducer(be, replicas);
  const BatchNormArgs args =
      bn_args(gamma.ptr(), beta.ptr(), rmean.ptr(), rvar.ptr(), 0.1f, 1e-5f, c.relu, &reducer);
  be.batchnorm_forward_train(x, args, y, saved);
  CHECK(reducer.calls >= 1);
  CHECK(saved.count == Approx(static_cast<double>(replicas * c.n * c.h * c.w)));
  Tensor dy = upload_activation(be, dyh, c.n, c.c, c.h, c.w);
  Tensor dx = be.activation(c.n, c.c, c.h, c.w);
  const int forward_calls = reducer.calls;
  be.batchnorm_backward(x, y, dy, args, saved, dx, bn_grads(dgamma.ptr(), dbeta.ptr(), false));
  CHECK(reducer.calls > forward_calls);

  // Reference: the batch repeated `replicas` times along N.
  ref::Act xr(c.n * replicas, c.c, c.h, c.w), dyr(c.n * replicas, c.c, c.h, c.w);
  for (int r = 0; r < replicas; ++r)
    for (size_t i = 0; i < n_local; ++i) {
      xr.v[r * n_local + i] = xh[i];
      dyr.v[r * n_local + i] = dyh[i];
    }
  ref::Vec rm(C, 0.0), rv(C, 1.0);
  const auto fr = ref::batchnorm_forward_train(xr, to_double(gh), to_double(bh), rm, rv, 0.1, 1e-5, c.relu);
  const auto gr = ref::batchnorm_backward(xr, dyr, to_double(gh), 1e-5, c.relu, to_double(bh));
  auto first_replica = [&](const ref::Vec& v) { return ref::Vec(v.begin(), v.begin() + static_cast<long>(n_local)); };
  auto per_rank = [&](ref::Vec v) {
    for (double& e : v) e /= replicas;
    return v;
  };
  RD_CHECK_CLOSE("sync bn y", download_activation(be, y), first_replica(fr.y.v), tol);
  RD_CHECK_CLOSE("sync bn running_mean", rmean.host(), rm, tol);
  RD_CHECK_CLOSE("sync bn running_var (global unbiased count)", rvar.host(), rv, tol);
  RD_CHECK_CLOSE("sync bn dx", download_activation(be, dx), first_replica(gr.dx.v), tol);
  RD_CHECK_CLOSE("sync bn dgamma (this rank's share)", dgamma.host(), per_rank(gr.dgamma), tol);
  RD_CHECK_CLOSE("sync bn dbeta (this rank's share)", dbeta.host(), per_rank(gr.dbeta), tol);
}

// ---- elementwise ---------------------------------------------------------------------------

struct Dims {
  int64_t n, c, h, w;
  size_t numel() const { return static_cast<size_t>(n * c * h * w); }
  std::string str() const {
    std::ostringstream os;
    os << "[" << n << "," << c << "," << h << "," << w << "]";
    return os.str();
  }
};

inline void check_relu(Backend& be, const Dims& d, Tol tol = {}) {
  INFO("relu " << d.str() << " on " << be.name() << " layout " << layout_name(be.activation_layout()));
  auto xh = random_floats(d.numel(), 51);
  for (size_t i = 0; i < xh.size(); i += 7) xh[i] = 0.f;  // exact zeros: gradient 0 (PyTorch)
  const auto dyh = to_float(projection_weights(d.numel(), 52));
  Tensor x = upload_activation(be, xh, d.n, d.c, d.h, d.w);
  Tensor y = be.activation(d.n, d.c, d.h, d.w);
  be.relu_forward(x, y);
  const ref::Act yr = ref::relu_forward(to_act(xh, d.n, d.c, d.h, d.w));
  RD_CHECK_CLOSE("relu forward", download_activation(be, y), yr.v, tol);
  Tensor dy = upload_activation(be, dyh, d.n, d.c, d.h, d.w);
  Tensor dx = be.activation(d.n, d.c, d.h, d.w);
  be.copy_from_host_nchw(filled(d.numel(), 123.f).data(), dx);
  be.relu_backward(y, dy, dx);
  const ref::Act dxr = ref::relu_backward(yr, to_act(dyh, d.n, d.c, d.h, d.w));
  RD_CHECK_CLOSE("relu backward", download_activation(be, dx), dxr.v, tol);

  const auto xf = separated_floats(d.numel(), 53);
  Tensor xt = upload_activation(be, xf, d.n, d.c, d.h, d.w);
  be.relu_forward(xt, y);
  be.relu_backward(y, dy, dx);
  auto loss = [&](const std::vector<float>& v) {
    Tensor t = upload_activation(be, v, d.n, d.c, d.h, d.w);
    be.relu_forward(t, y);
    return weighted_sum(download_activation(be, y), to_double(dyh));
  };
  RD_CHECK_GRADIENT("relu vs finite differences",
                    check_gradient<float>(loss, xf, to_double(download_activation(be, dx)), float_fd(24, 6)));
}

// ReLU on a RowMajor F32 matrix (the MLP head's hidden layer), which every
// backend takes in every precision (matrices stay F32 even when activations are
// fp16/bf16): forward, backward, in place.
inline void check_relu_matrix(Backend& be, int64_t rows, int64_t cols, Tol tol = {}) {
  INFO("relu on a " << rows << "x" << cols << " matrix on " << be.name());
  const size_t n = static_cast<size_t>(rows * cols);
  auto xh = random_floats(n, 54);
  for (size_t i = 0; i < n; i += 7) xh[i] = 0.f;
  const auto dyh = to_float(projection_weights(n, 55));
  Tensor x = upload_rowmajor(be, xh, Shape{rows, cols});
  Tensor y = upload_rowmajor(be, filled(n, 123.f), Shape{rows, cols});
  be.relu_forward(x, y);
  const ref::Act yr = ref::relu_forward(to_act(xh, rows, cols, 1, 1));
  RD_CHECK_CLOSE("relu forward (matrix)", download_rowmajor(be, y), yr.v, tol);
  Tensor dy = upload_rowmajor(be, dyh, Shape{rows, cols});
  Tensor dx = upload_rowmajor(be, filled(n, 123.f), Shape{rows, cols});
  be.relu_backward(y, dy, dx);
  const ref::Act dxr = ref::relu_backward(yr, to_act(dyh, rows, cols, 1, 1));
  RD_CHECK_CLOSE("relu backward (matrix)", download_rowmajor(be, dx), dxr.v, tol);
  be.relu_forward(x, x);  // in place, as a head may run it
  RD_CHECK_CLOSE("relu forward in place (matrix)", download_rowmajor(be, x), yr.v, tol);
}

inline void check_add(Backend& be, const Dims& d, bool relu, Tol tol = {}) {
  INFO("add " << (relu ? "+relu " : "") << d.str() << " on " << be.name() << " layout "
              << layout_name(be.activation_layout()));
  const auto ah = random_floats(d.numel(), 61), bh = random_floats(d.numel(), 62);
  const auto dyh = to_float(projection_weights(d.numel(), 63));
  Tensor a = upload_activation(be, ah, d.n, d.c, d.h, d.w);
  Tensor b = upload_activation(be, bh, d.n, d.c, d.h, d.w);
  Tensor y = be.activation(d.n, d.c, d.h, d.w);
  be.add_forward(a, b, relu, y);
  const ref::Act yr = ref::add_forward(to_act(ah, d.n, d.c, d.h, d.w), to_act(bh, d.n, d.c, d.h, d.w), relu);
  RD_CHECK_CLOSE("add forward", download_activation(be, y), yr.v, tol);
  Tensor dy = upload_activation(be, dyh, d.n, d.c, d.h, d.w);
  Tensor ds = be.activation(d.n, d.c, d.h, d.w);
  be.copy_from_host_nchw(filled(d.numel(), 123.f).data(), ds);
  be.add_backward(y, dy, relu, ds);
  const ref::Act dsr = ref::add_backward(yr, to_act(dyh, d.n, d.c, d.h, d.w), relu);
  const auto ds_backend = download_activation(be, ds);
  RD_CHECK_CLOSE("add backward", ds_backend, dsr.v, tol);

  // d loss / d a: a + b crosses zero for some elements, so kinks are skipped.
  auto loss = [&](const std::vector<float>& v) {
    Tensor t = upload_activation(be, v, d.n, d.c, d.h, d.w);
    be.add_forward(t, b, relu, y);
    return weighted_sum(download_activation(be, y), to_double(dyh));
  };
  GradCheckOptions o = float_fd(24, 7, 1e-3);
  o.skip_kinks = true;
  RD_CHECK_GRADIENT("add vs finite differences", check_gradient<float>(loss, ah, to_double(ds_backend), o));
}

inline void check_accumulate(Backend& be, const Dims& d, Tol tol = {}) {
  INFO("accumulate " << d.str() << " on " << be.name());
  const auto sh = random_floats(d.numel(), 71), dh = random_floats(d.numel(), 72);
  Tensor s = upload_activation(be, sh, d.n, d.c, d.h, d.w);
  Tensor t = upload_activation(be, dh, d.n, d.c, d.h, d.w);
  be.accumulate(s, t);
  RD_CHECK_CLOSE("dst += src", download_activation(be, t), plus(dh, to_double(sh)), tol);
}

// ---- pooling ---------------------------------------------------------------------------------

struct PoolCase {
  int64_t n, c, h, w;
  int kernel = 3, stride = 2, pad = 1;
  std::string str() const {
    std::ostringstream os;
    os << "maxpool x[" << n << "," << c << "," << h << "," << w << "] k" << kernel << " s" << stride
       << " p" << pad;
    return os.str();
  }
};

// `values`: "distinct" (no ties, finite differences apply), "ties" (a few
// integer levels: the first maximum in window order must win), "negative"
// (all below zero: padding must act as -inf, not 0).
inline void check_maxpool(Backend& be, const PoolCase& c, const std::string& values, Tol tol = {}) {
  INFO(c.str() << " values " << values << " on " << be.name() << " layout "
                << layout_name(be.activation_layout()));
  const size_t n_in = static_cast<size_t>(c.n * c.c * c.h * c.w);
  std::vector<float> xh;
  if (values == "ties") {
    xh = random_floats(n_in, 81, 0.f, 3.f);
    for (float& v : xh) v = std::floor(v);
  } else if (values == "negative") {
    xh = random_floats(n_in, 82, -3.f, -1.f);
  } else {
    xh = separated_floats(n_in, 83);
  }
  const int64_t oh = conv_out_size(c.h, c.kernel, c.stride, c.pad);
  const int64_t ow = conv_out_size(c.w, c.kernel, c.stride, c.pad);
  const auto dyh = to_float(projection_weights(static_cast<size_t>(c.n * c.c * oh * ow), 84));
  Tensor x = upload_activation(be, xh, c.n, c.c, c.h, c.w);
  Tensor y = be.activation(c.n, c.c, oh, ow);
  auto ws = be.allocate(std::max<size_t>(be.maxpool_workspace_bytes(y), 1));
  be.maxpool_forward(x, y, c.kernel, c.stride, c.pad, ws.get());
  const ref::Act xr = to_act(xh, c.n, c.c, c.h, c.w);
  const auto fr = ref::maxpool_forward(xr, c.kernel, c.stride, c.pad);
  RD_CHECK_CLOSE("maxpool forward", download_activation(be, y), fr.y.v, tol);

  Tensor dy = upload_activation(be, dyh, c.n, c.c, oh, ow);
  Tensor dx = be.activation(c.n, c.c, c.h, c.w);
  be.copy_from_host_nchw(filled(n_in, 123.f).data(), dx);
  be.maxpool_backward(dy, dx, c.kernel, c.stride, c.pad, ws.get());
  const ref::Act dxr = ref::maxpool_backward(xr, to_act(dyh, c.n, c.c, oh, ow), c.kernel, c.stride, c.pad);
  const auto dx_backend = download_activation(be, dx);
  RD_CHECK_CLOSE("maxpool backward (gradient to the first maximum)", dx_backend, dxr.v, tol);

  if (values != "distinct") return;
  auto loss = [&](const std::vector<float>& v) {
    Tensor t = upload_activation(be, v, c.n, c.c, c.h, c.w);
    be.maxpool_forward(t, y, c.kernel, c.stride, c.pad, ws.get());
    return weighted_sum(download_activation(be, y), to_double(dyh));
  };
  RD_CHECK_GRADIENT("maxpool vs finite differences",
                    check_gradient<float>(loss, xh, to_double(dx_backend), float_fd(24, 8)));
}

inline void check_global_avgpool(Backend& be, const Dims& d, Tol tol = {}) {
  INFO("global avgpool " << d.str() << " on " << be.name() << " layout " << layout_name(be.activation_layout()));
  const auto xh = random_floats(d.numel(), 91);
  const auto dyh = to_float(projection_weights(static_cast<size_t>(d.n * d.c), 92));
  Tensor x = upload_activation(be, xh, d.n, d.c, d.h, d.w);
  Tensor y = be.matrix(d.n, d.c);
  be.global_avgpool_forward(x, y);
  const ref::Mat yr = ref::global_avgpool_forward(to_act(xh, d.n, d.c, d.h, d.w));
  RD_CHECK_CLOSE("global avgpool forward", download_rowmajor(be, y), yr.v, tol);
  Tensor dy = upload_rowmajor(be, dyh, Shape{d.n, d.c});
  Tensor dx = be.activation(d.n, d.c, d.h, d.w);
  be.copy_from_host_nchw(filled(d.numel(), 123.f).data(), dx);
  be.global_avgpool_backward(dy, dx);
  const ref::Act dxr = ref::global_avgpool_backward(to_mat(dyh, d.n, d.c), d.h, d.w);
  const auto dx_backend = download_activation(be, dx);
  RD_CHECK_CLOSE("global avgpool backward", dx_backend, dxr.v, tol);
  auto loss = [&](const std::vector<float>& v) {
    Tensor t = upload_activation(be, v, d.n, d.c, d.h, d.w);
    be.global_avgpool_forward(t, y);
    return weighted_sum(download_rowmajor(be, y), to_double(dyh));
  };
  RD_CHECK_GRADIENT("global avgpool vs finite differences",
                    check_gradient<float>(loss, xh, to_double(dx_backend), float_fd(16, 9)));
}

// ---- linear -------------------------------------------------------------------------------------

struct LinearCase {
  int64_t n, in, out;
  std::string str() const {
    std::ostringstream os;
    os << "linear x[" << n << "," << in << "] -> " << out;
    return os.str();
  }
};

// fd_step: the loss is exactly linear in x, w and b, so any step is exact in real
// arithmetic; under TF32 GEMMs pass a large one (0.25): TF32 rounds x +- h to a
// 10-bit mantissa, which moves a 1e-2 step by up to ~2.4 % (and the difference
// quotient with it).
inline void check_linear(Backend& be, const LinearCase& c, Tol tol = {}, double fd_step = 1e-2) {
  INFO(c.str() << " on " << be.name());
  const auto xh = random_floats(static_cast<size_t>(c.n * c.in), 101);
  const auto wh = random_floats(static_cast<size_t>(c.out * c.in), 102);
  const auto bh = random_floats(static_cast<size_t>(c.out), 103);
  const auto dyh = to_float(projection_weights(static_cast<size_t>(c.n * c.out), 104));
  Tensor x = upload_rowmajor(be, xh, Shape{c.n, c.in});
  Tensor w = upload_rowmajor(be, wh, Shape{c.out, c.in});
  DeviceVector b(be, bh);
  Tensor y = upload_rowmajor(be, filled(static_cast<size_t>(c.n * c.out), 123.f), Shape{c.n, c.out});
  be.linear_forward(x, w, b.ptr(), y);
  const ref::Mat xr = to_mat(xh, c.n, c.in), wr = to_mat(wh, c.out, c.in);
  RD_CHECK_CLOSE("linear forward", download_rowmajor(be, y), ref::linear_forward(xr, wr, to_double(bh)).v, tol);

  Tensor dy = upload_rowmajor(be, dyh, Shape{c.n, c.out});
  Tensor dx = upload_rowmajor(be, filled(xh.size(), 123.f), Shape{c.n, c.in});
  Tensor dw = upload_rowmajor(be, filled(wh.size(), 123.f), Shape{c.out, c.in});
  DeviceVector db(be, filled(bh.size(), 123.f));
  be.linear_backward(x, w, dy, &dx, dw, db.ptr(), /*accumulate=*/false);
  const auto gr = ref::linear_backward(xr, wr, to_mat(dyh, c.n, c.out));
  const auto dx_backend = download_rowmajor(be, dx), dw_backend = download_rowmajor(be, dw);
  const auto db_backend = db.host();
  RD_CHECK_CLOSE("linear backward dx", dx_backend, gr.dx.v, tol);
  RD_CHECK_CLOSE("linear backward dw", dw_backend, gr.dw.v, tol);
  RD_CHECK_CLOSE("linear backward db", db_backend, gr.db, tol);

  // Accumulating into dw/db, and no dx wanted (the first layer of a head).
  const auto prior_w = random_floats(wh.size(), 105), prior_b = random_floats(bh.size(), 106);
  be.copy_from_host(dw.data, prior_w.data(), prior_w.size() * sizeof(float));
  be.copy_from_host(db.ptr(), prior_b.data(), prior_b.size() * sizeof(float));
  be.linear_backward(x, w, dy, nullptr, dw, db.ptr(), /*accumulate=*/true);
  RD_CHECK_CLOSE("linear backward dw (accumulate)", download_rowmajor(be, dw), plus(prior_w, gr.dw.v), tol);
  RD_CHECK_CLOSE("linear backward db (accumulate)", db.host(), plus(prior_b, gr.db), tol);

  const auto proj = to_double(dyh);
  auto loss = [&](const std::vector<float>& xv, const std::vector<float>& wv, const std::vector<float>& bv) {
    Tensor xt = upload_rowmajor(be, xv, Shape{c.n, c.in});
    Tensor wt = upload_rowmajor(be, wv, Shape{c.out, c.in});
    DeviceVector bt(be, bv);
    be.linear_forward(xt, wt, bt.ptr(), y);
    return weighted_sum(download_rowmajor(be, y), proj);
  };
  RD_CHECK_GRADIENT("linear dx vs finite differences",
                    check_gradient<float>([&](const std::vector<float>& v) { return loss(v, wh, bh); }, xh,
                                          to_double(dx_backend), float_fd(16, 10, fd_step)));
  RD_CHECK_GRADIENT("linear dw vs finite differences",
                    check_gradient<float>([&](const std::vector<float>& v) { return loss(xh, v, bh); }, wh,
                                          to_double(dw_backend), float_fd(16, 11, fd_step)));
  RD_CHECK_GRADIENT("linear db vs finite differences",
                    check_gradient<float>([&](const std::vector<float>& v) { return loss(xh, wh, v); }, bh,
                                          to_double(db_backend), float_fd(16, 12, fd_step)));
}

// ---- loss -----------------------------------------------------------------------------------------

inline void check_softmax_xent(Backend& be, int64_t n, int64_t k, float smoothing, float grad_scale,
                               Tol tol = {}) {
  INFO("softmax_xent N=" << n << " K=" << k << " smoothing " << smoothing << " grad_scale " << grad_scale
                         << " on " << be.name());
  auto zh = random_floats(static_cast<size_t>(n * k), 111, -3.f, 3.f);
  zh[0] += 80.f;  // one large logit: the log-sum-exp must stay finite
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % k);
  Tensor z = upload_rowmajor(be, zh, Shape{n, k});
  Tensor dz = upload_rowmajor(be, filled(zh.size(), 123.f), Shape{n, k});
  std::vector<int32_t> pred(static_cast<size_t>(n), -1);
  const double sum = be.softmax_xent(z, labels.data(), smoothing, grad_scale, &dz, pred.data());
  const auto r = ref::softmax_xent(to_mat(zh, n, k), labels, smoothing);
  CHECK(sum == Approx(r.mean_loss * static_cast<double>(n)).epsilon(1e-5));
  std::vector<double> expected_dz(r.dlogits.v);
  for (double& v : expected_dz) v *= grad_scale;
  const auto dz_backend = download_rowmajor(be, dz);
  RD_CHECK_CLOSE("xent dlogits", dz_backend, expected_dz, tol);
  CHECK(pred == r.predictions);
  // Without a gradient or predictions the loss is the same.
  CHECK(be.softmax_xent(z, labels.data(), smoothing, grad_scale, nullptr, nullptr) == Approx(sum).epsilon(1e-6));

  auto loss = [&](const std::vector<float>& v) {
    Tensor t = upload_rowmajor(be, v, Shape{n, k});
    return be.softmax_xent(t, labels.data(), smoothing, 1.f, nullptr, nullptr) / static_cast<double>(n) *
           grad_scale;
  };
  RD_CHECK_GRADIENT("xent vs finite differences",
                    check_gradient<float>(loss, zh, to_double(dz_backend), float_fd(40, 13, 1e-2)));
}

// fp16's step scalars in the backend's memory (math::AmpStepState), written and read back.
struct DeviceAmpState {
  Backend& backend;
  std::shared_ptr<void> memory;
  DeviceAmpState(Backend& be, const math::AmpStepState& s) : backend(be), memory(be.allocate(sizeof(s))) {
    set(s);
  }
  math::AmpStepState* ptr() { return static_cast<math::AmpStepState*>(memory.get()); }
  void set(const math::AmpStepState& s) { backend.copy_from_host(memory.get(), &s, sizeof(s)); }
  math::AmpStepState get() const {
    math::AmpStepState s;
    backend.copy_to_host(&s, memory.get(), sizeof(s));
    return s;
  }
};

// softmax_xent_sums against the ops that return the loss, on the same backend: the loss sum
// bit for bit, the same dlogits, the accuracy count against the returned predictions, the
// non-finite flag, and accumulation over calls (partner labels: the mixed loss).
inline void check_softmax_xent_sums(Backend& be, int64_t n, int64_t k, bool mixed) {
  INFO("softmax_xent_sums N=" << n << " K=" << k << (mixed ? " mixed" : "") << " on " << be.name());
  const float smoothing = 0.1f, lam = 0.3f, grad_scale = 2.f;
  auto zh = random_floats(static_cast<size_t>(n * k), 411, -3.f, 3.f);
  std::vector<int32_t> labels(static_cast<size_t>(n)), partners(static_cast<size_t>(n)),
      targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    labels[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % k);
    partners[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5 + 1) % k);
    targets[static_cast<size_t>(i)] = static_cast<int32_t>(i % k);
  }
  Tensor z = upload_rowmajor(be, zh, Shape{n, k});
  Tensor dz_ref = upload_rowmajor(be, filled(zh.size(), 123.f), Shape{n, k});
  Tensor dz = upload_rowmajor(be, filled(zh.size(), 321.f), Shape{n, k});
  std::vector<int32_t> pred(static_cast<size_t>(n), -1);
  const double loss = mixed ? be.softmax_xent_mixed(z, labels.data(), partners.data(), lam, smoothing, grad_scale,
                                                    &dz_ref, pred.data())
                            : be.softmax_xent(z, labels.data(), smoothing, grad_scale, &dz_ref, pred.data());
  double correct = 0;
  for (int64_t i = 0; i < n; ++i) correct += pred[static_cast<size_t>(i)] == targets[static_cast<size_t>(i)];
  std::shared_ptr<void> buf = be.allocate(3 * sizeof(double));
  auto* sums = static_cast<double*>(buf.get());
  const int32_t* partner = mixed ? partners.data() : nullptr;
  be.softmax_xent_sums(z, labels.data(), partner, lam, smoothing, grad_scale, &dz, targets.data(), sums, nullptr);
  double host[3] = {-1, -1, -1};
  be.copy_to_host(host, sums, sizeof host);
  CHECK(host[0] == loss);  // exact: the same rows summed in the same order
  CHECK(host[1] == correct);
  CHECK(host[2] == 0.0);
  CHECK(download_rowmajor(be, dz) == download_rowmajor(be, dz_ref));
  // A second batch adds to the sums; one with an infinite logit sets the flag.
  be.softmax_xent_sums(z, labels.data(), partner, lam, smoothing, grad_scale, nullptr, targets.data(), sums, nullptr);
  be.copy_to_host(host, sums, sizeof host);
  CHECK(host[0] == loss + loss);
  CHECK(host[1] == 2 * correct);
  CHECK(host[2] == 0.0);
  zh[1] = std::numeric_limits<float>::infinity();
  Tensor bad = upload_rowmajor(be, zh, Shape{n, k});
  be.softmax_xent_sums(bad, labels.data(), partner, lam, smoothing, grad_scale, nullptr, targets.data(), sums, nullptr);
  be.copy_to_host(host, sums, sizeof host);
  CHECK_FALSE(std::isfinite(host[0]));
  CHECK(host[2] == 1.0);
  // fp16's loss scale read from the backend's memory (not a power of two, a divisor of 3):
  // the same dlogits as the host's float(scale / 3) gives.
  DeviceAmpState amp(be, math::AmpStepState{.loss_scale = 1000.0});
  const float host_scale = static_cast<float>(1000.0 / 3.0);
  mixed ? be.softmax_xent_mixed(z, labels.data(), partners.data(), lam, smoothing, host_scale, &dz_ref, pred.data())
        : be.softmax_xent(z, labels.data(), smoothing, host_scale, &dz_ref, pred.data());
  be.softmax_xent_sums(z, labels.data(), partner, lam, smoothing, 3.f, &dz, targets.data(), sums, amp.ptr());
  CHECK(download_rowmajor(be, dz) == download_rowmajor(be, dz_ref));
}

// copy_to_host_queued delivers the data as it was when queued (work queued after it, here a
// fill, does not leak in), into every destination, after wait_queued_copies.
inline void check_queued_copies(Backend& be) {
  INFO("copy_to_host_queued on " << be.name());
  std::shared_ptr<void> buf = be.allocate(64 * sizeof(float));
  auto* dev = static_cast<float*>(buf.get());
  std::vector<float> values(64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) + 0.5f;
  be.copy_from_host(dev, values.data(), 64 * sizeof(float));
  std::vector<float> first(16, -1.f), second(48, -1.f);
  be.copy_to_host_queued(first.data(), dev, 16 * sizeof(float));
  be.copy_to_host_queued(second.data(), dev + 16, 48 * sizeof(float));
  be.fill(dev, 7.f, 64);
  be.wait_queued_copies();
  CHECK(first == std::vector<float>(values.begin(), values.begin() + 16));
  CHECK(second == std::vector<float>(values.begin() + 16, values.end()));
  be.wait_queued_copies();  // nothing queued: returns
  std::vector<float> again(64, -1.f);
  be.copy_to_host_queued(again.data(), dev, 64 * sizeof(float));
  be.wait_queued_copies();
  CHECK(again == std::vector<float>(64, 7.f));
}

// timing_mark / timing_seconds: marks in queue order give ordered, non-negative times once
// the device passed them; a mark never recorded is an error.
inline void check_timing_marks(Backend& be) {
  INFO("timing marks on " << be.name());
  std::shared_ptr<void> buf = be.allocate(1 << 20);
  float host = 0.f;
  be.timing_mark(0);
  be.fill(static_cast<float*>(buf.get()), 1.f, (1 << 20) / sizeof(float));
  be.timing_mark(1);
  be.fill(static_cast<float*>(buf.get()), 2.f, (1 << 20) / sizeof(float));
  be.timing_mark(3);
  be.copy_to_host_queued(&host, buf.get(), sizeof host);
  be.wait_queued_copies();
  CHECK(host == 2.f);
  const double first = be.timing_seconds(0, 1), both = be.timing_seconds(0, 3);
  CHECK(first >= 0.0);
  CHECK(both >= first);
  CHECK(be.timing_seconds(1, 1) == 0.0);
  CHECK_THROWS_AS(be.timing_seconds(0, 2), Error);
  CHECK_THROWS_AS(be.timing_mark(-1), Error);
}

// Graphs (graph_begin .. graph_launch) with stage_loss_labels: a loss recorded once is not
// run until launched; each launch computes, bit for bit, what the eager op computes on the
// logits and labels of that moment (staged before the launch); a free since the recording
// makes the launch refuse and drop the graph; memory_events counts allocations and frees.
// A backend without graphs says so (graph_begin false), and staging leaves its losses alone.
inline void check_graphs(Backend& be) {
  INFO("graphs and staged loss labels on " << be.name());
  const int64_t n = 6, k = 5;
  const float smoothing = 0.1f, grad_scale = 4.f;
  auto labels_for = [&](int shift) {
    std::vector<int32_t> l(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) l[static_cast<size_t>(i)] = static_cast<int32_t>((i * 3 + shift) % k);
    return l;
  };
  const std::vector<int32_t> first = labels_for(1), second = labels_for(4), targets = labels_for(2);
  const uint64_t events_before = be.memory_events();
  std::shared_ptr<void> buf = be.allocate(3 * sizeof(double));
  CHECK(be.memory_events() > events_before);
  auto* sums = static_cast<double*>(buf.get());
  auto zh = random_floats(static_cast<size_t>(n * k), 91, -2.f, 2.f);
  auto zh_next = zh;
  zh_next[3] += 1.5f;
  // The eager results for both batches, first: a launch refuses once memory was allocated
  // after its recording.
  auto eager = [&](const std::vector<float>& logits, const std::vector<int32_t>& labels, std::vector<float>& grad) {
    std::shared_ptr<void> ref = be.allocate(3 * sizeof(double));
    Tensor ref_z = upload_rowmajor(be, logits, Shape{n, k});
    Tensor ref_dz = upload_rowmajor(be, filled(logits.size(), 0.f), Shape{n, k});
    be.softmax_xent_sums(ref_z, labels.data(), nullptr, 1.f, smoothing, grad_scale, &ref_dz, targets.data(),
                         static_cast<double*>(ref.get()), nullptr);
    std::vector<double> out(3);
    be.copy_to_host(out.data(), ref.get(), 3 * sizeof(double));
    grad = download_rowmajor(be, ref_dz);
    return out;
  };
  std::vector<float> grad_first, grad_second;
  const std::vector<double> want_first = eager(zh, first, grad_first), want_second = eager(zh_next, second, grad_second);
  Tensor z = upload_rowmajor(be, zh, Shape{n, k});
  Tensor dz = upload_rowmajor(be, filled(zh.size(), 0.f), Shape{n, k});
  auto read_sums = [&] {
    std::vector<double> out(3);
    be.copy_to_host(out.data(), sums, 3 * sizeof(double));
    return out;
  };
  be.stage_loss_labels(first.data(), nullptr, targets.data(), n);
  if (!be.graph_begin()) {
    // No graphs: staging changed nothing, the loss reads the arrays it is given.
    CHECK_THROWS_AS(be.graph_end(), Error);
    CHECK_THROWS_AS(be.graph_launch(0), Error);
    be.copy_from_host(z.data, zh_next.data(), zh_next.size() * sizeof(float));
    be.softmax_xent_sums(z, second.data(), nullptr, 1.f, smoothing, grad_scale, &dz, targets.data(), sums, nullptr);
    CHECK(read_sums() == want_second);
    CHECK(download_rowmajor(be, dz) == grad_second);
    return;
  }
  be.softmax_xent_sums(z, first.data(), nullptr, 1.f, smoothing, grad_scale, &dz, targets.data(), sums, nullptr);
  const int graph = be.graph_end();
  REQUIRE(graph >= 0);
  CHECK(read_sums() == std::vector<double>(3, 0.0));  // recorded, not run
  REQUIRE(be.graph_launch(graph));
  CHECK(read_sums() == want_first);
  CHECK(download_rowmajor(be, dz) == grad_first);
  // New logits and labels at the same addresses: the replay computes on them.
  be.copy_from_host(z.data, zh_next.data(), zh_next.size() * sizeof(float));
  be.fill(reinterpret_cast<float*>(sums), 0.f, 3 * sizeof(double) / sizeof(float));
  be.stage_loss_labels(second.data(), nullptr, targets.data(), n);
  REQUIRE(be.graph_launch(graph));
  CHECK(read_sums() == want_second);
  CHECK(download_rowmajor(be, dz) == grad_second);
  // Staging inside a recording is refused.
  REQUIRE(be.graph_begin());
  CHECK_THROWS_AS(be.stage_loss_labels(first.data(), nullptr, targets.data(), n), Error);
  be.graph_drop(be.graph_end());
  // Memory freed since the recording: the launch refuses and the graph is gone.
  const uint64_t events = be.memory_events();
  be.allocate(64).reset();
  CHECK(be.memory_events() >= events + 2);
  CHECK_FALSE(be.graph_launch(graph));
  CHECK_THROWS_AS(be.graph_launch(graph), Error);
  CHECK_THROWS_AS(be.graph_drop(-1), Error);
}

// A recorded optimizer step: SGD on a convolution's weight, recorded once in a graph, its lr
// and step count written before each launch (set_optimizer_scalars, outside the graph). Each
// launch updates with that launch's values, bit for bit the eager steps with the host's; and
// a convolution queued right after a launch reads the updated weight, not a staged copy made
// before it (a launch of a graph holding an update marks staged weights stale, as the eager
// update does): the same output as the updated values in a fresh weight buffer. A backend
// without graphs runs the steps eagerly and must agree too.
inline void check_graph_updates(Backend& be) {
  INFO("an optimizer step recorded in a graph, then a convolution, on " << be.name() << " layout "
                                                                       << layout_name(be.activation_layout()));
  const ConvGeometry geo{3, 1, 1, 1};
  const Shape wshape{4, 4, 3, 3};
  const auto count = static_cast<size_t>(wshape.numel());
  const auto wh = random_floats(count, 191), gh = random_floats(count, 192);
  const auto xh = random_floats(2 * 4 * 6 * 6, 193);
  // Everything allocated and staged first: a launch refuses after an allocation.
  Tensor x = upload_activation(be, xh, 2, 4, 6, 6);
  Tensor w = upload_rowmajor(be, wh, wshape), fresh = upload_rowmajor(be, wh, wshape);
  Tensor after = be.activation(2, 4, 6, 6), expected = be.activation(2, 4, 6, 6);
  DeviceVector g(be, gh), eager_params(be, wh);
  auto memory = be.allocate(sizeof(math::OptimizerStepScalars));
  auto* scalars = static_cast<math::OptimizerStepScalars*>(memory.get());
  const double lrs[2] = {0.25, 0.0625};
  math::SgdHyper h{.lr = 99.f, .momentum = 0.f, .dampening = 0.f, .weight_decay = 1e-2f, .nesterov = false,
                   .first_step = false, .amp = nullptr, .scalars = scalars};
  // The eager steps with the host's lr first: an eager update would itself mark w's staged copy stale.
  for (int step = 0; step < 2; ++step) {
    math::SgdHyper host = h;
    host.lr = static_cast<float>(lrs[step]), host.first_step = step == 0, host.scalars = nullptr;
    be.sgd_step(eager_params.ptr(), g.ptr(), nullptr, count, host);
  }
  be.conv2d_forward(x, w, after, geo);  // stages w (NHWC / 16-bit copies) as it is now
  be.conv2d_forward(x, fresh, expected, geo);
  be.set_optimizer_scalars(scalars, math::OptimizerStepScalars{lrs[0], 1.0});
  int graph = -1;
  if (be.graph_begin()) {
    be.sgd_step(w.f32(), g.ptr(), nullptr, count, h);
    graph = be.graph_end();
    CHECK(download_rowmajor(be, w) == wh);  // recorded, not run
  }
  for (int step = 0; step < 2; ++step) {
    if (step > 0) be.set_optimizer_scalars(scalars, math::OptimizerStepScalars{lrs[step], step + 1.0});
    if (graph >= 0) REQUIRE(be.graph_launch(graph));
    else be.sgd_step(w.f32(), g.ptr(), nullptr, count, h);
  }
  be.conv2d_forward(x, w, after, geo);  // nothing between the launch and this convolution
  const std::vector<float> updated = download_rowmajor(be, w);
  CHECK(updated == eager_params.host());
  CHECK(updated != wh);
  be.copy_from_host(fresh.data, updated.data(), count * sizeof(float));
  be.conv2d_forward(x, fresh, expected, geo);
  CHECK(download_activation(be, after) == download_activation(be, expected));
  if (graph >= 0) be.graph_drop(graph);
}

inline void check_softmax_xent_sums_all(Backend& be) {
  for (bool mixed : {false, true}) {
    check_softmax_xent_sums(be, 4, 3, mixed);
    check_softmax_xent_sums(be, 16, 10, mixed);
    check_softmax_xent_sums(be, 5, 1000, mixed);
  }
}

// ---- MixUp / CutMix (torchvision's reference recipe) -------------------------------------------------------------------

// mix_images against the formula on the host: partner of image i is i-1 (0's is the
// last); MixUp rounds both products to float before the sum, as torch does, so F32
// storage must match exactly (16-bit storage: within `tol`, one rounding of input and output).
inline void check_mix_images(Backend& be, const Dims& d, const math::ImageMix& mix, Tol tol = {0, 0}) {
  INFO("mix_images " << d.str() << (mix.cutmix ? " cutmix" : " mixup") << " lambda " << mix.lambda << " box ["
                     << mix.x0 << "," << mix.x1 << ")x[" << mix.y0 << "," << mix.y1 << ") on " << be.name());
  const auto xh = random_floats(d.numel(), 211, -2.5f, 2.5f);
  Tensor src = upload_activation(be, xh, d.n, d.c, d.h, d.w);
  Tensor dst = be.activation(d.n, d.c, d.h, d.w);
  be.mix_images(src, dst, mix);
  const volatile float self_w = mix.lambda;  // volatile: no FMA in this reference either
  const float partner_w = static_cast<float>(1.0 - static_cast<double>(mix.lambda));
  std::vector<double> expected(d.numel());
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t c = 0; c < d.c; ++c)
      for (int64_t h = 0; h < d.h; ++h)
        for (int64_t w = 0; w < d.w; ++w) {
          const int64_t p = n == 0 ? d.n - 1 : n - 1;
          const float self = xh[static_cast<size_t>(((n * d.c + c) * d.h + h) * d.w + w)];
          const float other = xh[static_cast<size_t>(((p * d.c + c) * d.h + h) * d.w + w)];
          float v;
          if (mix.cutmix) {
            v = (h >= mix.y0 && h < mix.y1 && w >= mix.x0 && w < mix.x1) ? other : self;
          } else {
            const volatile float a = self * self_w, b = other * partner_w;
            v = a + b;
          }
          expected[static_cast<size_t>(((n * d.c + c) * d.h + h) * d.w + w)] = v;
        }
  RD_CHECK_CLOSE("mixed batch", download_activation(be, dst), expected, tol);
}

// softmax_xent_mixed against the soft-target formula in double, its finite
// differences, and softmax_xent when the target is one label.
inline void check_softmax_xent_mixed(Backend& be, int64_t n, int64_t k, float lam, float smoothing, float grad_scale,
                                     Tol tol = {}) {
  INFO("softmax_xent_mixed N=" << n << " K=" << k << " lam " << lam << " smoothing " << smoothing << " on "
                               << be.name());
  const auto zh = random_floats(static_cast<size_t>(n * k), 311, -3.f, 3.f);
  std::vector<int32_t> labels(static_cast<size_t>(n)), partners(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    labels[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % k);
    partners[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5 + 1) % k);  // equal to the label for some rows
  }
  Tensor z = upload_rowmajor(be, zh, Shape{n, k});
  Tensor dz = upload_rowmajor(be, filled(zh.size(), 123.f), Shape{n, k});
  std::vector<int32_t> pred(static_cast<size_t>(n), -1);
  const double sum = be.softmax_xent_mixed(z, labels.data(), partners.data(), lam, smoothing, grad_scale, &dz,
                                           pred.data());
  double expected_sum = 0.0;
  std::vector<double> expected_dz(zh.size());
  std::vector<int32_t> expected_pred(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const float* row = &zh[static_cast<size_t>(r * k)];
    double mx = row[0], se = 0.0;
    int32_t am = 0;
    for (int64_t j = 1; j < k; ++j)
      if (row[j] > mx) { mx = row[j]; am = static_cast<int32_t>(j); }
    for (int64_t j = 0; j < k; ++j) se += std::exp(row[j] - mx);
    expected_pred[static_cast<size_t>(r)] = am;
    for (int64_t j = 0; j < k; ++j) {
      const double t = (j == labels[static_cast<size_t>(r)] ? lam : 0.0) +
                       (j == partners[static_cast<size_t>(r)] ? 1.0 - lam : 0.0);
      const double q = t * (1.0 - smoothing) + smoothing / static_cast<double>(k);
      const double logp = row[j] - mx - std::log(se);
      expected_sum -= q * logp;
      expected_dz[static_cast<size_t>(r * k + j)] = (std::exp(logp) - q) / static_cast<double>(n) * grad_scale;
    }
  }
  CHECK(sum == Approx(expected_sum).epsilon(1e-5));
  const auto dz_backend = download_rowmajor(be, dz);
  RD_CHECK_CLOSE("mixed xent dlogits", dz_backend, expected_dz, tol);
  CHECK(pred == expected_pred);
  // One label (lam = 1): the same loss as softmax_xent.
  CHECK(be.softmax_xent_mixed(z, labels.data(), partners.data(), 1.f, smoothing, 1.f, nullptr, nullptr) ==
        Approx(be.softmax_xent(z, labels.data(), smoothing, 1.f, nullptr, nullptr)).epsilon(1e-6));
  auto loss = [&](const std::vector<float>& v) {
    Tensor t = upload_rowmajor(be, v, Shape{n, k});
    return be.softmax_xent_mixed(t, labels.data(), partners.data(), lam, smoothing, 1.f, nullptr, nullptr) /
           static_cast<double>(n) * grad_scale;
  };
  RD_CHECK_GRADIENT("mixed xent vs finite differences",
                    check_gradient<float>(loss, zh, to_double(dz_backend), float_fd(40, 14, 1e-2)));
}

inline void check_mixing_ops(Backend& be, Tol image_tol = {0, 0}) {
  for (const Dims& d : {Dims{3, 3, 5, 7}, Dims{1, 3, 4, 4}, Dims{2, 16, 3, 5}}) {
    math::ImageMix mixup;
    for (float lam : {0.f, 0.3f, 0.77f, 1.f}) {
      mixup.lambda = lam;
      check_mix_images(be, d, mixup, image_tol);
    }
    math::ImageMix cut;
    cut.cutmix = true;
    for (const auto& box : {std::array<int64_t, 4>{0, 0, 0, 0}, std::array<int64_t, 4>{1, 0, 3, 2},
                            std::array<int64_t, 4>{0, 0, d.w, d.h}, std::array<int64_t, 4>{2, 1, d.w, d.h - 1}}) {
      cut.x0 = box[0];
      cut.y0 = box[1];
      cut.x1 = box[2];
      cut.y1 = box[3];
      check_mix_images(be, d, cut, image_tol);
    }
  }
  check_softmax_xent_mixed(be, 4, 3, 0.3f, 0.f, 1.f);
  check_softmax_xent_mixed(be, 5, 10, 0.62f, 0.1f, 1.f);
  check_softmax_xent_mixed(be, 3, 1000, 0.5f, 0.1f, 0.5f);
  check_softmax_xent_mixed(be, 16, 3, 0.9f, 0.1f, 65536.f);
}

// ---- optimizers -----------------------------------------------------------------------------------

inline void check_adam(Backend& be, size_t count, float weight_decay, int steps, Tol tol = {1e-5, 1e-6}) {
  INFO("adam count " << count << " weight_decay " << weight_decay << " on " << be.name());
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  const auto p0 = random_floats(count, 121);
  DeviceVector p(be, p0), m(be, filled(count, 0.f)), v(be, filled(count, 0.f));
  ref::Vec pr = to_double(p0);
  ref::AdamState st;
  for (int s = 1; s <= steps; ++s) {
    auto gh = random_floats(count, 122 + static_cast<uint64_t>(s));
    gh[0] = 0.f;  // zero gradient, zero state: the update must stay finite
    DeviceVector g(be, gh);
    be.adam_step(p.ptr(), g.ptr(), m.ptr(), v.ptr(), count,
                 math::AdamArgs{.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = weight_decay,
                                .step = s});
    ref::adam_step(pr, to_double(gh), st, lr, b1, b2, eps, weight_decay);
  }
  RD_CHECK_CLOSE("adam params", p.host(), pr, tol);
  RD_CHECK_CLOSE("adam exp_avg", m.host(), st.m, tol);
  RD_CHECK_CLOSE("adam exp_avg_sq", v.host(), st.v, tol);
}

inline void check_sgd(Backend& be, size_t count, float momentum, float dampening, float weight_decay,
                      bool nesterov, int steps, Tol tol = {1e-5, 1e-6}) {
  INFO("sgd count " << count << " momentum " << momentum << " dampening " << dampening << " wd "
                    << weight_decay << (nesterov ? " nesterov" : "") << " on " << be.name());
  const float lr = 0.05f;
  const auto p0 = random_floats(count, 131);
  DeviceVector p(be, p0), buf(be, filled(count, 777.f));  // first step must ignore old contents
  ref::Vec pr = to_double(p0);
  ref::SgdState st;
  for (int s = 1; s <= steps; ++s) {
    const auto gh = random_floats(count, 132 + static_cast<uint64_t>(s));
    DeviceVector g(be, gh);
    be.sgd_step(p.ptr(), g.ptr(), buf.ptr(), count,
                math::SgdHyper{.lr = lr, .momentum = momentum, .dampening = dampening, .weight_decay = weight_decay,
                               .nesterov = nesterov, .first_step = s == 1});
    ref::sgd_step(pr, to_double(gh), st, lr, momentum, dampening, weight_decay, nesterov);
  }
  RD_CHECK_CLOSE("sgd params", p.host(), pr, tol);
  if (momentum != 0.f) RD_CHECK_CLOSE("sgd momentum buffer", buf.host(), st.buf, tol);
}

// Per-segment ops: segments of different lengths (one empty, one over many blocks), a
// gap between two that nothing may touch; per-segment decay and scale.
inline void check_segment_ops(Backend& be) {
  INFO("segment ops on " << be.name());
  const std::vector<int64_t> ranges = {0, 5, 5, 5, 9, 20009, 20017, 20030};  // [20009, 20017) is a gap
  const size_t segs = ranges.size() / 2, count = 20030;
  const auto xh = random_floats(count, 161);
  DeviceVector x(be, xh);
  std::vector<double> sums(segs, -1.0);
  be.segment_sum_squares(x.ptr(), ranges.data(), segs, sums.data());
  for (size_t s = 0; s < segs; ++s) {
    double expect = 0.0;
    for (int64_t i = ranges[2 * s]; i < ranges[2 * s + 1]; ++i) expect += static_cast<double>(xh[i]) * xh[i];
    CHECK(sums[s] == Approx(expect).epsilon(1e-12));
  }
  // SGD with momentum, each segment its own decay, against the float64 reference per segment.
  const std::vector<float> decay = {0.1f, 0.5f, 0.f, 1e-3f}, scale = {1.f, 1.f, 1.f, 1.f};
  const auto p0 = random_floats(count, 162);
  DeviceVector p(be, p0), buf(be, filled(count, 0.f));
  std::vector<ref::Vec> pr(segs);
  std::vector<ref::SgdState> st(segs);
  for (size_t s = 0; s < segs; ++s) pr[s] = ref::Vec(p0.begin() + ranges[2 * s], p0.begin() + ranges[2 * s + 1]);
  for (int t = 1; t <= 3; ++t) {
    const auto gh = random_floats(count, 163 + static_cast<uint64_t>(t));
    DeviceVector g(be, gh);
    math::SegmentHyper h;
    h.rule = math::SegmentRule::Sgd, h.lr = 0.05f, h.momentum = 0.9f, h.first_step = t == 1;
    be.segment_step(p.ptr(), g.ptr(), buf.ptr(), nullptr, ranges.data(), segs, decay.data(), scale.data(), h);
    for (size_t s = 0; s < segs; ++s)
      ref::sgd_step(pr[s], ref::Vec(gh.begin() + ranges[2 * s], gh.begin() + ranges[2 * s + 1]), st[s], 0.05, 0.9,
                    0.0, decay[s], false);
  }
  const std::vector<float> got = p.host();
  for (size_t s = 0; s < segs; ++s) {
    const std::vector<float> seg(got.begin() + ranges[2 * s], got.begin() + ranges[2 * s + 1]);
    RD_CHECK_CLOSE("segment sgd params", seg, pr[s], (Tol{1e-5, 1e-6}));
  }
  for (size_t i = 20009; i < 20017; ++i) CHECK(got[i] == p0[i]);  // the gap
  // LAMB's second pass: p -= lr * (g * scale) with each segment's scale, exactly as in float.
  const std::vector<float> trust = {2.f, 3.f, 0.5f, 0.25f};
  const auto gh = random_floats(count, 170);
  DeviceVector q(be, p0), g(be, gh);
  math::SegmentHyper h;
  h.rule = math::SegmentRule::ScaledDescent, h.lr = 0.1f;
  be.segment_step(q.ptr(), g.ptr(), nullptr, nullptr, ranges.data(), segs, decay.data(), trust.data(), h);
  const std::vector<float> moved = q.host();
  for (size_t s = 0; s < segs; ++s)
    for (int64_t i = ranges[2 * s]; i < ranges[2 * s + 1]; ++i) {
      float expect = p0[i];
      expect -= 0.1f * (gh[i] * trust[s]);
      REQUIRE(moved[i] == Approx(expect).epsilon(1e-6).margin(1e-7));
    }
}

// The weight EMA: a copy (n_averaged == 0) is exact; each update is torch's ema_avg,
// decay * avg + (1 - decay) * cur in float32, against a double reference.
inline void check_ema(Backend& be, size_t count, double decay, int steps, Tol tol = {1e-6, 1e-7}) {
  INFO("ema_update count " << count << " decay " << decay << " on " << be.name());
  const float d = static_cast<float>(decay), omd = static_cast<float>(1.0 - decay);
  const auto first = random_floats(count, 161);
  DeviceVector avg(be, filled(count, 555.f)), cur(be, first);
  be.ema_update(avg.ptr(), cur.ptr(), count, d, omd, true);
  CHECK(avg.host() == first);
  ref::Vec r = to_double(first);
  for (int s = 1; s <= steps; ++s) {
    const auto model = random_floats(count, 161 + static_cast<uint64_t>(s));
    DeviceVector m(be, model);
    be.ema_update(avg.ptr(), m.ptr(), count, d, omd, false);
    for (size_t i = 0; i < count; ++i)
      r[i] = static_cast<double>(d) * r[i] + static_cast<double>(omd) * static_cast<double>(model[i]);
  }
  RD_CHECK_CLOSE("ema average", avg.host(), r, tol);
  CHECK(cur.host() == first);  // the model is only read
}

// ---- memory helpers -----------------------------------------------------------------------------

inline void check_copy_roundtrip(Backend& be, const Dims& d) {
  INFO("nchw round trip " << d.str() << " on " << be.name() << " layout " << layout_name(be.activation_layout()));
  const auto xh = random_floats(d.numel(), 141);
  Tensor x = upload_activation(be, xh, d.n, d.c, d.h, d.w);
  CHECK(x.layout == be.layout_for_channels(d.c));  // blocked layouts only where C fills the blocks
  CHECK(x.shape == (Shape{d.n, d.c, d.h, d.w}));
  CHECK(download_activation(be, x) == xh);
}

inline void check_fill_scale_finite(Backend& be, size_t count) {
  INFO("fill/scale/all_finite count " << count << " on " << be.name());
  DeviceVector v(be, filled(count, 0.f));
  be.fill(v.ptr(), 2.5f, count);
  CHECK(v.host() == filled(count, 2.5f));
  const auto xh = random_floats(count, 151);
  DeviceVector s(be, xh);
  be.scale(s.ptr(), -0.75f, count);
  std::vector<double> expected(count);
  for (size_t i = 0; i < count; ++i) expected[i] = -0.75 * static_cast<double>(xh[i]);
  RD_CHECK_CLOSE("scale", s.host(), expected, (Tol{1e-7, 0.0}));
  CHECK(be.all_finite(s.ptr(), count));
  // A non-finite value anywhere, including the vector tail, is found.
  for (size_t pos : {size_t{0}, count / 2, count - 1}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      auto h = xh;
      h[pos] = bad;
      DeviceVector t(be, h);
      INFO("non-finite " << bad << " at " << pos);
      CHECK_FALSE(be.all_finite(t.ptr(), count));
    }
  }
}

// torchvision ToTensor (x / 255) then Normalize ((x - mean) / std).
inline void check_images_u8(Backend& be, const Dims& d, bool normalize) {
  INFO("images_u8_to_activation " << d.str() << (normalize ? " normalized" : "") << " on " << be.name());
  REQUIRE(d.c == 3);
  std::vector<uint8_t> img(d.numel());
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  img[0] = 0;
  img[1] = 255;
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  Tensor x = be.activation(d.n, 3, d.h, d.w);
  be.images_u8_to_activation(img.data(), x, normalize ? mean : nullptr, normalize ? stdv : nullptr);
  std::vector<double> expected(d.numel());
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t h = 0; h < d.h; ++h)
        for (int64_t w = 0; w < d.w; ++w) {
          double v = img[static_cast<size_t>(((n * d.h + h) * d.w + w) * 3 + c)] / 255.0;
          if (normalize) v = (v - mean[c]) / stdv[c];
          expected[static_cast<size_t>(((n * 3 + c) * d.h + h) * d.w + w)] = v;
        }
  RD_CHECK_CLOSE("u8 NHWC -> activation", download_activation(be, x), expected, (Tol{1e-6, 1e-6}));
}

// RandomErasing after Normalize: each image's box zeroed in every channel, the rest
// untouched. Values are small integers, exact in f16/bf16, so every precision is exact.
inline void check_erase_rectangles(Backend& be) {
  const int64_t N = 4, C = 3, H = 6, W = 7;
  INFO("erase_rectangles on " << be.name());
  std::vector<float> x(static_cast<size_t>(N * C * H * W));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) + 1.f;
  // (top, left, height, width): inside, none (0 height), the whole image, the corner.
  const int32_t boxes[N * 4] = {1, 2, 3, 4, 0, 0, 0, 5, 0, 0, 6, 7, 5, 6, 1, 1};
  Tensor t = upload_activation(be, x, N, C, H, W);
  be.erase_rectangles(t, boxes);
  std::vector<double> expected(x.begin(), x.end());
  for (int64_t n = 0; n < N; ++n) {
    const int32_t* b = boxes + 4 * n;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = b[0]; y < b[0] + b[2]; ++y)
        for (int64_t w = b[1]; w < b[1] + b[3]; ++w) expected[static_cast<size_t>(((n * C + c) * H + y) * W + w)] = 0.0;
  }
  RD_CHECK_CLOSE("erase_rectangles", download_activation(be, t), expected, (Tol{0.0, 0.0}));
  // A box outside the image is refused, naming the image.
  const int32_t outside[N * 4] = {0, 0, 1, 1, 0, 0, 1, 1, 4, 0, 3, 1, 0, 0, 1, 1};
  CHECK_THROWS_WITH(be.erase_rectangles(t, outside), Catch::Contains("image 2's box"));
}

// allocate gives zeroed memory, also when it reuses a block that held data; copy_from_host
// and copy_to_host move bytes unchanged, at any offset into the allocation.
inline void check_allocate_and_copies(Backend& be) {
  INFO("allocate / copy_from_host / copy_to_host on " << be.name());
  const size_t count = 1000;
  const auto values = random_floats(count, 171);
  for (int round = 0; round < 2; ++round) {
    INFO("allocation " << round);
    std::shared_ptr<void> buf = be.allocate(count * sizeof(float));
    REQUIRE(buf);
    auto* dev = static_cast<float*>(buf.get());
    std::vector<float> host(count, -1.f);
    be.copy_to_host(host.data(), dev, count * sizeof(float));
    CHECK(host == filled(count, 0.f));
    be.copy_from_host(dev, values.data(), count * sizeof(float));
    std::vector<float> part(300, -1.f);
    be.copy_to_host(part.data(), dev + 123, part.size() * sizeof(float));
    CHECK(part == std::vector<float>(values.begin() + 123, values.begin() + 423));
    be.copy_from_host(dev + 10, values.data(), 5 * sizeof(float));
    be.copy_to_host(host.data(), dev, count * sizeof(float));
    std::vector<float> expected = values;
    std::copy(values.begin(), values.begin() + 5, expected.begin() + 10);
    CHECK(host == expected);
  }
}

// synchronize returns once the work queued before it has run: a read that nothing orders
// after that work (`read_unordered`: on CUDA a copy on the legacy stream, which the
// backend's non-blocking streams do not wait for) sees the last write.
using UnorderedRead = std::function<void(Backend&, void* host, const void* device, size_t bytes)>;
inline void check_synchronize(Backend& be, const UnorderedRead& read_unordered) {
  INFO("synchronize on " << be.name());
  const size_t count = size_t{1} << 20;
  std::shared_ptr<void> buf = be.allocate(count * sizeof(float));
  auto* dev = static_cast<float*>(buf.get());
  be.synchronize();  // the zeroing of the allocation, if queued
  for (int i = 1; i <= 8; ++i) be.fill(dev, static_cast<float>(i), count);
  be.synchronize();
  std::vector<float> head(16, -1.f), tail(16, -1.f);
  read_unordered(be, head.data(), dev, head.size() * sizeof(float));
  read_unordered(be, tail.data(), dev + count - tail.size(), tail.size() * sizeof(float));
  CHECK(head == filled(head.size(), 8.f));
  CHECK(tail == filled(tail.size(), 8.f));
}

// unscale_and_check: data *= factor, then whether every element is finite (a non-finite
// value in the last element, past any vector width, is found).
inline void check_unscale_and_check(Backend& be) {
  INFO("unscale_and_check on " << be.name());
  std::vector<float> h(4099, 2.f);
  DeviceVector v(be, h);
  CHECK(be.unscale_and_check(v.ptr(), 0.5f, h.size()));
  CHECK(v.host() == filled(h.size(), 1.f));
  h[4098] = INFINITY;
  DeviceVector bad(be, h);
  CHECK_FALSE(be.unscale_and_check(bad.ptr(), 0.5f, h.size()));
}

// amp_unscale: the gradients divided by the device's loss scale, and GradScaler's update
// decided in the backend's memory: skip + halve (floor 1), double after 2000 good steps,
// the step count advanced by good steps only; a non-finite value in the last element
// (past any vector width) or the caller's flag is an overflow.
inline void check_amp_unscale(Backend& be) {
  INFO("amp_unscale on " << be.name());
  std::vector<float> h(4099, 2.f);
  DeviceVector good(be, h);
  DeviceAmpState state(be, math::AmpStepState{.loss_scale = 4.0});
  be.amp_unscale(good.ptr(), h.size(), state.ptr(), false);
  CHECK(good.host() == filled(h.size(), 0.5f));
  math::AmpStepState s = state.get();
  CHECK(s.found_inf == 0.0);
  CHECK(s.steps == 1.0);
  CHECK(s.good_steps == 1.0);
  CHECK(s.loss_scale == 4.0);
  h[4098] = INFINITY;
  DeviceVector bad(be, h);
  be.amp_unscale(bad.ptr(), h.size(), state.ptr(), false);
  s = state.get();
  CHECK(s.found_inf == 1.0);
  CHECK(s.steps == 1.0);  // a skipped step is not counted
  CHECK(s.skipped == 1.0);
  CHECK(s.good_steps == 0.0);
  CHECK(s.loss_scale == 2.0);
  // Another rank's overflow (the caller's flag) skips a finite step too; the scale stops at 1.
  for (double expected_scale : {1.0, 1.0}) {
    DeviceVector finite(be, filled(8, 1.f));
    be.amp_unscale(finite.ptr(), 8, state.ptr(), true);
    s = state.get();
    CHECK(s.found_inf == 1.0);
    CHECK(s.loss_scale == expected_scale);
  }
  CHECK(s.skipped == 3.0);
  // The 2000th good step in a row doubles the scale.
  state.set(math::AmpStepState{.loss_scale = 8.0, .good_steps = 1999.0, .steps = 5.0});
  DeviceVector finite(be, filled(8, 16.f));
  be.amp_unscale(finite.ptr(), 8, state.ptr(), false);
  CHECK(finite.host() == filled(8, 2.f));  // divided by the scale before the doubling
  s = state.get();
  CHECK(s.loss_scale == 16.0);
  CHECK(s.good_steps == 2000.0);
  CHECK(s.steps == 6.0);
}

// The update ops given an AmpStepState: a skipped step changes no parameter and no state;
// otherwise the result is bit for bit that of the host's arguments for the device's step
// count (Adam's bias corrections, SGD's momentum seed at step 1).
inline void check_updates_with_amp_state(Backend& be) {
  INFO("adam_step / sgd_step / segment_step with an AmpStepState on " << be.name());
  const size_t count = 1000;
  const auto p0 = random_floats(count, 171), gh = random_floats(count, 172), s0 = random_floats(count, 173);
  const auto sq = filled(count, 0.25f);
  const std::vector<int64_t> ranges = {0, 300, 300, 1000};
  const std::vector<float> decay = {0.f, 0.01f}, scale = {1.f, 0.999f};
  for (double device_steps : {1.0, 3.0}) {
    for (bool skipped : {false, true}) {
      INFO("device step count " << device_steps << (skipped ? " (skipped)" : ""));
      DeviceAmpState state(be, math::AmpStepState{.found_inf = skipped ? 1.0 : 0.0, .steps = device_steps});
      const auto t = static_cast<int64_t>(device_steps);
      DeviceVector g(be, gh);
      // Adam, flat.
      DeviceVector pa(be, p0), ma(be, s0), va(be, sq), pb(be, p0), mb(be, s0), vb(be, sq);
      math::AdamArgs a{.lr = 0.01f, .weight_decay = 1e-3f, .step = 1};
      math::AdamArgs host_args = a;
      host_args.step = t;
      a.amp = state.ptr();
      be.adam_step(pa.ptr(), g.ptr(), ma.ptr(), va.ptr(), count, a);
      be.adam_step(pb.ptr(), g.ptr(), mb.ptr(), vb.ptr(), count, host_args);
      CHECK(pa.host() == (skipped ? p0 : pb.host()));
      CHECK(ma.host() == (skipped ? s0 : mb.host()));
      CHECK(va.host() == (skipped ? sq : vb.host()));
      // SGD with momentum, flat: step 1 seeds the buffer with the gradient.
      DeviceVector ps(be, p0), bs(be, s0), pt(be, p0), bt(be, s0);
      math::SgdHyper sh{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.f, .weight_decay = 0.f, .nesterov = false,
                        .first_step = false};
      math::SgdHyper host_sgd = sh;
      host_sgd.first_step = t == 1;
      sh.amp = state.ptr();
      be.sgd_step(ps.ptr(), g.ptr(), bs.ptr(), count, sh);
      be.sgd_step(pt.ptr(), g.ptr(), bt.ptr(), count, host_sgd);
      CHECK(ps.host() == (skipped ? p0 : pt.host()));
      CHECK(bs.host() == (skipped ? s0 : bt.host()));
      // AdamW per segment: the step size from the exact lr and betas.
      DeviceVector pw(be, p0), mw(be, s0), vw(be, sq), px(be, p0), mx(be, s0), vx(be, sq);
      math::SegmentHyper wh;
      wh.rule = math::SegmentRule::AdamW, wh.lr = 0.01f, wh.exact_lr = 0.01;
      math::SegmentHyper host_w = wh;
      math::segment_step_scalars(host_w, device_steps, true);
      wh.amp = state.ptr();
      be.segment_step(pw.ptr(), g.ptr(), mw.ptr(), vw.ptr(), ranges.data(), 2, decay.data(), scale.data(), wh);
      be.segment_step(px.ptr(), g.ptr(), mx.ptr(), vx.ptr(), ranges.data(), 2, decay.data(), scale.data(), host_w);
      CHECK(pw.host() == (skipped ? p0 : px.host()));
      CHECK(mw.host() == (skipped ? s0 : mx.host()));
      CHECK(vw.host() == (skipped ? sq : vx.host()));
      // The ops read the state, never write it.
      CHECK(state.get().steps == device_steps);
    }
  }
}

// set_optimizer_scalars and the update ops given its block (flat Adam and SGD; per segment
// SGD, Adam, AdamW, RMSprop): the block reads back as written, and each update is bit for
// bit the one the host's scalars give for the same lr and step count (the hyper-parameters'
// own lr is a decoy the ops must not use). AdamW's factor comes from the block's lr, formed
// as the host forms 1 - lr * decay in double (the caller's scale is a decoy too). With an
// AmpStepState as well, its step count wins over the block's.
inline void check_updates_with_step_scalars(Backend& be) {
  INFO("set_optimizer_scalars and the update ops reading it on " << be.name());
  using R = math::SegmentRule;
  const size_t count = 1000;
  const auto p0 = random_floats(count, 181), gh = random_floats(count, 182), s0 = random_floats(count, 183);
  const auto sq = filled(count, 0.25f);
  const std::vector<int64_t> ranges = {0, 300, 300, 1000};
  const std::vector<float> decay = {0.f, 0.0123f}, ones = {1.f, 1.f}, decoy_scale = {0.5f, 0.5f};
  auto memory = be.allocate(sizeof(math::OptimizerStepScalars));
  auto* scalars = static_cast<math::OptimizerStepScalars*>(memory.get());
  DeviceAmpState amp(be, math::AmpStepState{.steps = 2.0});
  DeviceVector g(be, gh);
  for (const double lr : {0.0123456789, 3e-4})
    for (const double steps : {1.0, 4.0})
      for (const bool with_amp : {false, true}) {
        INFO("lr " << lr << " steps " << steps << (with_amp ? " with an AmpStepState of 2 steps" : ""));
        be.set_optimizer_scalars(scalars, math::OptimizerStepScalars{lr, steps});
        math::OptimizerStepScalars back;
        be.copy_to_host(&back, scalars, sizeof back);
        CHECK((back.lr == lr && back.steps == steps));
        const double t = with_amp ? 2.0 : steps;
        const auto host_lr = static_cast<float>(lr);
        // Adam, flat.
        DeviceVector pa(be, p0), ma(be, s0), va(be, sq), pb(be, p0), mb(be, s0), vb(be, sq);
        math::AdamArgs a{.lr = 99.f, .weight_decay = 1e-3f, .step = 7, .amp = with_amp ? amp.ptr() : nullptr,
                         .scalars = scalars};
        be.adam_step(pa.ptr(), g.ptr(), ma.ptr(), va.ptr(), count, a);
        be.adam_step(pb.ptr(), g.ptr(), mb.ptr(), vb.ptr(), count,
                     math::AdamArgs{.lr = host_lr, .weight_decay = 1e-3f, .step = static_cast<int64_t>(t)});
        CHECK(pa.host() == pb.host());
        CHECK((ma.host() == mb.host() && va.host() == vb.host()));
        // SGD with momentum, flat: the block's step 1 seeds the buffer.
        DeviceVector ps(be, p0), bs(be, s0), pt(be, p0), bt(be, s0);
        math::SgdHyper sh{.lr = 99.f, .momentum = 0.9f, .dampening = 0.f, .weight_decay = 1e-3f, .nesterov = false,
                          .first_step = t != 1.0, .amp = with_amp ? amp.ptr() : nullptr, .scalars = scalars};
        math::SgdHyper host_sgd = sh;
        host_sgd.lr = host_lr, host_sgd.first_step = t == 1.0, host_sgd.amp = nullptr, host_sgd.scalars = nullptr;
        be.sgd_step(ps.ptr(), g.ptr(), bs.ptr(), count, sh);
        be.sgd_step(pt.ptr(), g.ptr(), bt.ptr(), count, host_sgd);
        CHECK((ps.host() == pt.host() && bs.host() == bt.host()));
        for (const R rule : {R::Sgd, R::Adam, R::AdamW, R::RmsProp}) {
          INFO("segment rule " << static_cast<int>(rule));
          math::SegmentHyper dh;
          dh.rule = rule, dh.lr = 99.f, dh.exact_lr = 99.0, dh.first_step = t != 1.0;
          dh.momentum = rule == R::Sgd || rule == R::RmsProp ? 0.9f : 0.f;
          math::SegmentHyper hh = dh;
          dh.scalars = scalars;
          dh.amp = with_amp ? amp.ptr() : nullptr;
          hh.lr = host_lr, hh.exact_lr = lr;
          math::segment_step_scalars(hh, t, math::segment_rule_uses_moments(rule));
          std::vector<float> host_scale = ones;
          // The optimizer's former host expression: torch.optim.AdamW's factor in double.
          if (rule == R::AdamW)
            for (size_t i = 0; i < decay.size(); ++i) host_scale[i] = static_cast<float>(1.0 - lr * decay[i]);
          // RMSprop's first state is its square average: non-negative.
          const auto& first = rule == R::RmsProp ? sq : s0;
          const auto& second = rule == R::RmsProp ? s0 : sq;
          DeviceVector pw(be, p0), mw(be, first), vw(be, second), px(be, p0), mx(be, first), vx(be, second);
          be.segment_step(pw.ptr(), g.ptr(), mw.ptr(), vw.ptr(), ranges.data(), 2, decay.data(),
                          rule == R::AdamW ? decoy_scale.data() : ones.data(), dh);
          be.segment_step(px.ptr(), g.ptr(), mx.ptr(), vx.ptr(), ranges.data(), 2, decay.data(), host_scale.data(),
                          hh);
          CHECK(pw.host() == px.host());
          CHECK((mw.host() == mx.host() && vw.host() == vx.host()));
        }
      }
  math::OptimizerStepScalars back;
  be.copy_to_host(&back, scalars, sizeof back);
  CHECK((back.lr == 3e-4 && back.steps == 4.0));  // the ops read the block, never write it
}

// fp16/bf16 storage: finite differences are meaningless, so compare with the
// reference applied to the values as stored (read back after the upload).
inline void check_reduced_precision_elementwise(Backend& be, const Dims& d) {
  INFO("reduced-precision relu/add/accumulate/pooling " << d.str() << " on " << be.name());
  Tensor a = upload_activation(be, random_floats(d.numel(), 601), d.n, d.c, d.h, d.w);
  Tensor b = upload_activation(be, random_floats(d.numel(), 602), d.n, d.c, d.h, d.w);
  const auto ah = download_activation(be, a), bh = download_activation(be, b);
  const ref::Act ar = to_act(ah, d.n, d.c, d.h, d.w), br = to_act(bh, d.n, d.c, d.h, d.w);
  const Tol storage{1e-2, 1e-2};  // one rounding of the result
  Tensor y = be.activation(d.n, d.c, d.h, d.w);
  be.relu_forward(a, y);
  RD_CHECK_CLOSE("relu", download_activation(be, y), ref::relu_forward(ar).v, storage);
  Tensor dx = be.activation(d.n, d.c, d.h, d.w);
  be.relu_backward(y, b, dx);
  RD_CHECK_CLOSE("relu backward", download_activation(be, dx), ref::relu_backward(ref::relu_forward(ar), br).v, storage);
  be.add_forward(a, b, true, y);
  const ref::Act sum = ref::add_forward(ar, br, true);
  RD_CHECK_CLOSE("add+relu", download_activation(be, y), sum.v, storage);
  be.add_backward(y, b, true, dx);
  RD_CHECK_CLOSE("add+relu backward", download_activation(be, dx), ref::add_backward(sum, br, true).v, storage);
  be.accumulate(a, b);
  RD_CHECK_CLOSE("accumulate", download_activation(be, b), ref::add_forward(ar, br, false).v, storage);
  const int64_t oh = conv_out_size(d.h, 3, 2, 1), ow = conv_out_size(d.w, 3, 2, 1);
  Tensor p = be.activation(d.n, d.c, oh, ow);
  auto ws = be.allocate(be.maxpool_workspace_bytes(p));
  be.maxpool_forward(a, p, 3, 2, 1, ws.get());
  RD_CHECK_CLOSE("maxpool", download_activation(be, p), ref::maxpool_forward(ar, 3, 2, 1).y.v, storage);
  Tensor m = be.matrix(d.n, d.c);
  be.global_avgpool_forward(a, m);
  RD_CHECK_CLOSE("global avgpool", download_rowmajor(be, m), ref::global_avgpool_forward(ar).v, storage);
}

// Sums in place over two identical "ranks": every statistic doubles, so the
// synchronised result must equal the local one. Runs on the backend's own
// stream (scale), as an NCCL reducer's collective would be ordered.
struct TwoIdenticalRanks : ChannelReducer {
  Backend& be;
  int calls = 0;
  explicit TwoIdenticalRanks(Backend& b) : be(b) {}
  void allreduce_sum(double* data, size_t count) override {
    scale_device_doubles(be, data, count, 2.0);
    ++calls;
  }
  int participants() const override { return 2; }
};

// The SyncBatchNorm path with two identical ranks equals local batch norm: the same y,
// dx, running mean and (local) dgamma; only the running variance differs (unbiased with
// twice the count).
inline void check_batchnorm_sync_identical_ranks(Backend& be) {
  INFO("SyncBatchNorm with two identical ranks on " << be.name());
  const int64_t n = 3, c = 9, h = 4, w = 5;
  const size_t C = static_cast<size_t>(c);
  const auto xh = random_floats(static_cast<size_t>(n * c * h * w), 501, -1.f, 2.f);
  const auto dyh = random_floats(xh.size(), 502);
  Tensor x = upload_activation(be, xh, n, c, h, w), dy = upload_activation(be, dyh, n, c, h, w);
  DeviceVector gamma(be, random_floats(C, 503, 0.5f, 1.5f)), beta(be, random_floats(C, 504));
  std::vector<std::vector<float>> out;
  for (bool synced : {false, true}) {
    TwoIdenticalRanks reducer(be);
    DeviceVector rm(be, filled(C, 0.f)), rv(be, filled(C, 1.f)), sm(be, filled(C, 0.f)), si(be, filled(C, 0.f));
    DeviceVector dg(be, filled(C, 0.f)), db(be, filled(C, 0.f));
    BatchNormSaved saved;
    saved.mean = sm.ptr();
    saved.invstd = si.ptr();
    Tensor y = be.activation(n, c, h, w), dx = be.activation(n, c, h, w);
    const BatchNormArgs args =
        bn_args(gamma.ptr(), beta.ptr(), rm.ptr(), rv.ptr(), 0.1f, 1e-5f, true, synced ? &reducer : nullptr);
    be.batchnorm_forward_train(x, args, y, saved);
    be.batchnorm_backward(x, y, dy, args, saved, dx, bn_grads(dg.ptr(), db.ptr(), false));
    if (synced) {
      CHECK(reducer.calls == 2);
      CHECK(saved.count == Approx(2.0 * static_cast<double>(n * h * w)));
    }
    out.push_back(download_activation(be, y));
    out.push_back(download_activation(be, dx));
    out.push_back(rm.host());
    out.push_back(dg.host());
  }
  RD_CHECK_CLOSE("sync y", out[4], to_double(out[0]), (Tol{1e-5, 1e-5}));
  RD_CHECK_CLOSE("sync dx", out[5], to_double(out[1]), (Tol{1e-4, 1e-5}));
  RD_CHECK_CLOSE("sync running mean", out[6], to_double(out[2]), (Tol{1e-5, 1e-6}));
  RD_CHECK_CLOSE("sync dgamma (local)", out[7], to_double(out[3]), (Tol{1e-5, 1e-6}));
}

}  // namespace rd::test
