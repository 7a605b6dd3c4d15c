// Naive reference implementation of every backend op: plain loops over NCHW
// host arrays in double precision, written straight from the PyTorch
// definitions. It is deliberately slow and obvious, so the backends (oneDNN,
// cuDNN, hand-written kernels) can be checked against it; its own backward
// passes are checked against finite differences in tests/backend/test_reference.cpp.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace rd::ref {

using Vec = std::vector<double>;

// A 4-D NCHW array.
struct Act {
  int64_t n = 0, c = 0, h = 0, w = 0;
  Vec v;

  Act() = default;
  Act(int64_t n_, int64_t c_, int64_t h_, int64_t w_)
      : n(n_), c(c_), h(h_), w(w_), v(static_cast<size_t>(n_ * c_ * h_ * w_), 0.0) {}
  size_t size() const { return v.size(); }
  size_t index(int64_t in, int64_t ic, int64_t ih, int64_t iw) const {
    return static_cast<size_t>(((in * c + ic) * h + ih) * w + iw);
  }
  double& at(int64_t in, int64_t ic, int64_t ih, int64_t iw) { return v[index(in, ic, ih, iw)]; }
  double at(int64_t in, int64_t ic, int64_t ih, int64_t iw) const { return v[index(in, ic, ih, iw)]; }
  bool same_shape(const Act& o) const { return n == o.n && c == o.c && h == o.h && w == o.w; }
};

// A RowMajor (rows, cols) matrix.
struct Mat {
  int64_t rows = 0, cols = 0;
  Vec v;

  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(static_cast<size_t>(r * c), 0.0) {}
  double& at(int64_t r, int64_t c) { return v[static_cast<size_t>(r * cols + c)]; }
  double at(int64_t r, int64_t c) const { return v[static_cast<size_t>(r * cols + c)]; }
};

inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("reference op: " + what);
}

inline int64_t out_size(int64_t in, int kernel, int stride, int pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

// ---- convolution, weight (O, I / groups, k, k), no bias ----------------------
// `groups` splits input and output channels into equal slices; output channel o
// reads only input slice o / (O / groups), as torch.nn.Conv2d(groups=...).

inline Act conv2d_forward(const Act& x, const Vec& w, int64_t out_channels, int kernel, int stride,
                          int pad, int groups = 1) {
  require(groups > 0 && x.c % groups == 0 && out_channels % groups == 0, "conv groups divide channels");
  const int64_t in_g = x.c / groups, out_g = out_channels / groups;
  require(static_cast<int64_t>(w.size()) == out_channels * in_g * kernel * kernel, "conv weight size");
  Act y(x.n, out_channels, out_size(x.h, kernel, stride, pad), out_size(x.w, kernel, stride, pad));
  for (int64_t n = 0; n < y.n; ++n)
    for (int64_t o = 0; o < y.c; ++o)
      for (int64_t oh = 0; oh < y.h; ++oh)
        for (int64_t ow = 0; ow < y.w; ++ow) {
          double acc = 0.0;
          const int64_t first_in = (o / out_g) * in_g;
          for (int64_t i = 0; i < in_g; ++i)
            for (int kh = 0; kh < kernel; ++kh)
              for (int kw = 0; kw < kernel; ++kw) {
                const int64_t ih = oh * stride - pad + kh, iw = ow * stride - pad + kw;
                if (ih < 0 || ih >= x.h || iw < 0 || iw >= x.w) continue;
                acc += x.at(n, first_in + i, ih, iw) *
                       w[static_cast<size_t>(((o * in_g + i) * kernel + kh) * kernel + kw)];
              }
          y.at(n, o, oh, ow) = acc;
        }
  return y;
}

// dx for an input of spatial size (in_h, in_w): the transpose of forward.
inline Act conv2d_backward_data(const Act& dy, const Vec& w, int64_t in_channels, int64_t in_h,
                                int64_t in_w, int kernel, int stride, int pad, int groups = 1) {
  require(groups > 0 && in_channels % groups == 0 && dy.c % groups == 0, "conv groups divide channels");
  const int64_t in_g = in_channels / groups, out_g = dy.c / groups;
  require(static_cast<int64_t>(w.size()) == dy.c * in_g * kernel * kernel, "conv weight size");
  require(dy.h == out_size(in_h, kernel, stride, pad) && dy.w == out_size(in_w, kernel, stride, pad),
          "conv dy spatial size");
  Act dx(dy.n, in_channels, in_h, in_w);
  for (int64_t n = 0; n < dy.n; ++n)
    for (int64_t i = 0; i < in_channels; ++i)
      for (int64_t ih = 0; ih < in_h; ++ih)
        for (int64_t iw = 0; iw < in_w; ++iw) {
          double acc = 0.0;
          const int64_t group = i / in_g, i_in_group = i % in_g;
          for (int64_t o = group * out_g; o < (group + 1) * out_g; ++o)
            for (int kh = 0; kh < kernel; ++kh)
              for (int kw = 0; kw < kernel; ++kw) {
                const int64_t th = ih + pad - kh, tw = iw + pad - kw;
                if (th < 0 || tw < 0 || th % stride || tw % stride) continue;
                const int64_t oh = th / stride, ow = tw / stride;
                if (oh >= dy.h || ow >= dy.w) continue;
                acc += dy.at(n, o, oh, ow) *
                       w[static_cast<size_t>(((o * in_g + i_in_group) * kernel + kh) * kernel + kw)];
              }
          dx.at(n, i, ih, iw) = acc;
        }
  return dx;
}

inline Vec conv2d_backward_weights(const Act& x, const Act& dy, int kernel, int stride, int pad,
                                   int groups = 1) {
  require(x.n == dy.n && dy.h == out_size(x.h, kernel, stride, pad) &&
              dy.w == out_size(x.w, kernel, stride, pad),
          "conv x/dy shapes");
  require(groups > 0 && x.c % groups == 0 && dy.c % groups == 0, "conv groups divide channels");
  const int64_t in_g = x.c / groups, out_g = dy.c / groups;
  Vec dw(static_cast<size_t>(dy.c * in_g * kernel * kernel), 0.0);
  for (int64_t o = 0; o < dy.c; ++o)
    for (int64_t i = 0; i < in_g; ++i)
      for (int kh = 0; kh < kernel; ++kh)
        for (int kw = 0; kw < kernel; ++kw) {
          double acc = 0.0;
          const int64_t xi = (o / out_g) * in_g + i;
          for (int64_t n = 0; n < x.n; ++n)
            for (int64_t oh = 0; oh < dy.h; ++oh)
              for (int64_t ow = 0; ow < dy.w; ++ow) {
                const int64_t ih = oh * stride - pad + kh, iw = ow * stride - pad + kw;
                if (ih < 0 || ih >= x.h || iw < 0 || iw >= x.w) continue;
                acc += x.at(n, xi, ih, iw) * dy.at(n, o, oh, ow);
              }
          dw[static_cast<size_t>(((o * in_g + i) * kernel + kh) * kernel + kw)] = acc;
        }
  return dw;
}

// ---- batch norm (per channel over N, H, W), optional fused ReLU ---------------

struct BnStats {
  Vec mean, var;  // var is the biased batch variance (what normalisation uses)
};

inline BnStats batch_stats(const Act& x) {
  BnStats s{Vec(static_cast<size_t>(x.c), 0.0), Vec(static_cast<size_t>(x.c), 0.0)};
  const double count = static_cast<double>(x.n * x.h * x.w);
  for (int64_t c = 0; c < x.c; ++c) {
    double sum = 0.0;
    for (int64_t n = 0; n < x.n; ++n)
      for (int64_t h = 0; h < x.h; ++h)
        for (int64_t w = 0; w < x.w; ++w) sum += x.at(n, c, h, w);
    const double mean = sum / count;
    double sq = 0.0;  // two-pass: exact enough to be the yardstick
    for (int64_t n = 0; n < x.n; ++n)
      for (int64_t h = 0; h < x.h; ++h)
        for (int64_t w = 0; w < x.w; ++w) sq += (x.at(n, c, h, w) - mean) * (x.at(n, c, h, w) - mean);
    s.mean[static_cast<size_t>(c)] = mean;
    s.var[static_cast<size_t>(c)] = sq / count;
  }
  return s;
}

inline Act bn_normalize(const Act& x, const Vec& gamma, const Vec& beta, const Vec& mean,
                        const Vec& var, double eps, bool relu) {
  Act y(x.n, x.c, x.h, x.w);
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c) {
      const size_t ci = static_cast<size_t>(c);
      const double invstd = 1.0 / std::sqrt(var[ci] + eps);
      for (int64_t h = 0; h < x.h; ++h)
        for (int64_t w = 0; w < x.w; ++w) {
          double v = gamma[ci] * (x.at(n, c, h, w) - mean[ci]) * invstd + beta[ci];
          if (relu && v < 0.0) v = 0.0;
          y.at(n, c, h, w) = v;
        }
    }
  return y;
}

struct BnTrainResult {
  Act y;
  Vec mean, invstd;  // what the backend stores in BatchNormSaved
};

// Training mode; updates running stats in place like torch.nn.BatchNorm2d:
// running = (1 - momentum) * running + momentum * batch, with the *unbiased*
// batch variance for running_var.
inline BnTrainResult batchnorm_forward_train(const Act& x, const Vec& gamma, const Vec& beta,
                                             Vec& running_mean, Vec& running_var, double momentum,
                                             double eps, bool relu) {
  require(static_cast<int64_t>(gamma.size()) == x.c && static_cast<int64_t>(beta.size()) == x.c,
          "bn gamma/beta size");
  const BnStats s = batch_stats(x);
  const double count = static_cast<double>(x.n * x.h * x.w);
  BnTrainResult r{bn_normalize(x, gamma, beta, s.mean, s.var, eps, relu), s.mean,
                  Vec(static_cast<size_t>(x.c))};
  for (size_t c = 0; c < static_cast<size_t>(x.c); ++c) {
    r.invstd[c] = 1.0 / std::sqrt(s.var[c] + eps);
    const double unbiased = count > 1.0 ? s.var[c] * count / (count - 1.0) : s.var[c];
    running_mean[c] = (1.0 - momentum) * running_mean[c] + momentum * s.mean[c];
    running_var[c] = (1.0 - momentum) * running_var[c] + momentum * unbiased;
  }
  return r;
}

inline Act batchnorm_forward_eval(const Act& x, const Vec& gamma, const Vec& beta,
                                  const Vec& running_mean, const Vec& running_var, double eps,
                                  bool relu) {
  return bn_normalize(x, gamma, beta, running_mean, running_var, eps, relu);
}

struct BnGrads {
  Act dx;
  Vec dgamma, dbeta;
};

// Training-mode backward, statistics recomputed from x (independent of any
// saved state). With relu, dy is first masked by y > 0.
inline BnGrads batchnorm_backward(const Act& x, const Act& dy_in, const Vec& gamma, double eps,
                                  bool relu, const Vec& beta) {
  const BnStats s = batch_stats(x);
  const double count = static_cast<double>(x.n * x.h * x.w);
  Act dy = dy_in;
  if (relu) {
    const Act y = bn_normalize(x, gamma, beta, s.mean, s.var, eps, false);
    for (size_t i = 0; i < dy.size(); ++i)
      if (!(y.v[i] > 0.0)) dy.v[i] = 0.0;
  }
  BnGrads g{Act(x.n, x.c, x.h, x.w), Vec(static_cast<size_t>(x.c), 0.0),
            Vec(static_cast<size_t>(x.c), 0.0)};
  for (int64_t c = 0; c < x.c; ++c) {
    const size_t ci = static_cast<size_t>(c);
    const double invstd = 1.0 / std::sqrt(s.var[ci] + eps);
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t n = 0; n < x.n; ++n)
      for (int64_t h = 0; h < x.h; ++h)
        for (int64_t w = 0; w < x.w; ++w) {
          const double xhat = (x.at(n, c, h, w) - s.mean[ci]) * invstd;
          sum_dy += dy.at(n, c, h, w);
          sum_dy_xhat += dy.at(n, c, h, w) * xhat;
        }
    g.dbeta[ci] = sum_dy;
    g.dgamma[ci] = sum_dy_xhat;
    for (int64_t n = 0; n < x.n; ++n)
      for (int64_t h = 0; h < x.h; ++h)
        for (int64_t w = 0; w < x.w; ++w) {
          const double xhat = (x.at(n, c, h, w) - s.mean[ci]) * invstd;
          g.dx.at(n, c, h, w) = gamma[ci] * invstd *
                                (dy.at(n, c, h, w) - sum_dy / count - xhat * sum_dy_xhat / count);
        }
  }
  return g;
}

// ---- elementwise --------------------------------------------------------------

inline Act relu_forward(const Act& x) {
  Act y = x;
  for (double& v : y.v) v = v > 0.0 ? v : 0.0;
  return y;
}

// PyTorch's threshold_backward: gradient passes where the output is > 0.
inline Act relu_backward(const Act& y, const Act& dy) {
  Act dx = dy;
  for (size_t i = 0; i < dx.size(); ++i)
    if (!(y.v[i] > 0.0)) dx.v[i] = 0.0;
  return dx;
}

inline Act add_forward(const Act& a, const Act& b, bool relu) {
  require(a.same_shape(b), "add shapes");
  Act y = a;
  for (size_t i = 0; i < y.size(); ++i) {
    y.v[i] += b.v[i];
    if (relu && y.v[i] < 0.0) y.v[i] = 0.0;
  }
  return y;
}

inline Act add_backward(const Act& y, const Act& dy, bool relu) {
  return relu ? relu_backward(y, dy) : dy;
}

// ---- pooling ------------------------------------------------------------------

struct MaxPoolResult {
  Act y;
  std::vector<int64_t> argmax;  // flat index into x of each output's source
};

// PyTorch max_pool2d: padding acts as -inf, the first maximum in window order
// (row by row) wins ties, NaN propagates.
inline MaxPoolResult maxpool_forward(const Act& x, int kernel, int stride, int pad) {
  MaxPoolResult r{Act(x.n, x.c, out_size(x.h, kernel, stride, pad), out_size(x.w, kernel, stride, pad)),
                  {}};
  r.argmax.assign(r.y.size(), -1);
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c)
      for (int64_t oh = 0; oh < r.y.h; ++oh)
        for (int64_t ow = 0; ow < r.y.w; ++ow) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t best_i = -1;
          for (int kh = 0; kh < kernel; ++kh)
            for (int kw = 0; kw < kernel; ++kw) {
              const int64_t ih = oh * stride - pad + kh, iw = ow * stride - pad + kw;
              if (ih < 0 || ih >= x.h || iw < 0 || iw >= x.w) continue;
              const double v = x.at(n, c, ih, iw);
              if (best_i < 0 || v > best || std::isnan(v)) {
                best = v;
                best_i = static_cast<int64_t>(x.index(n, c, ih, iw));
                if (std::isnan(v)) break;
              }
            }
          const size_t oi = r.y.index(n, c, oh, ow);
          r.y.v[oi] = best;
          r.argmax[oi] = best_i;
        }
  return r;
}

inline Act maxpool_backward(const Act& x, const Act& dy, int kernel, int stride, int pad) {
  const MaxPoolResult f = maxpool_forward(x, kernel, stride, pad);
  require(f.y.same_shape(dy), "maxpool dy shape");
  Act dx(x.n, x.c, x.h, x.w);
  for (size_t i = 0; i < dy.size(); ++i) dx.v[static_cast<size_t>(f.argmax[i])] += dy.v[i];
  return dx;
}

inline Mat global_avgpool_forward(const Act& x) {
  Mat y(x.n, x.c);
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c) {
      double s = 0.0;
      for (int64_t h = 0; h < x.h; ++h)
        for (int64_t w = 0; w < x.w; ++w) s += x.at(n, c, h, w);
      y.at(n, c) = s / static_cast<double>(x.h * x.w);
    }
  return y;
}

inline Act global_avgpool_backward(const Mat& dy, int64_t h, int64_t w) {
  Act dx(dy.rows, dy.cols, h, w);
  for (int64_t n = 0; n < dx.n; ++n)
    for (int64_t c = 0; c < dx.c; ++c)
      for (int64_t ih = 0; ih < h; ++ih)
        for (int64_t iw = 0; iw < w; ++iw) dx.at(n, c, ih, iw) = dy.at(n, c) / static_cast<double>(h * w);
  return dx;
}

// ---- linear: y = x W^T + b -----------------------------------------------------

inline Mat linear_forward(const Mat& x, const Mat& w, const Vec& b) {
  require(x.cols == w.cols && (b.empty() || static_cast<int64_t>(b.size()) == w.rows), "linear shapes");
  Mat y(x.rows, w.rows);
  for (int64_t n = 0; n < x.rows; ++n)
    for (int64_t o = 0; o < w.rows; ++o) {
      double acc = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
      for (int64_t i = 0; i < x.cols; ++i) acc += x.at(n, i) * w.at(o, i);
      y.at(n, o) = acc;
    }
  return y;
}

struct LinearGrads {
  Mat dx, dw;
  Vec db;
};

inline LinearGrads linear_backward(const Mat& x, const Mat& w, const Mat& dy) {
  LinearGrads g{Mat(x.rows, x.cols), Mat(w.rows, w.cols), Vec(static_cast<size_t>(w.rows), 0.0)};
  for (int64_t n = 0; n < x.rows; ++n)
    for (int64_t i = 0; i < x.cols; ++i) {
      double acc = 0.0;
      for (int64_t o = 0; o < w.rows; ++o) acc += dy.at(n, o) * w.at(o, i);
      g.dx.at(n, i) = acc;
    }
  for (int64_t o = 0; o < w.rows; ++o) {
    for (int64_t i = 0; i < w.cols; ++i) {
      double acc = 0.0;
      for (int64_t n = 0; n < x.rows; ++n) acc += dy.at(n, o) * x.at(n, i);
      g.dw.at(o, i) = acc;
    }
    double acc = 0.0;
    for (int64_t n = 0; n < x.rows; ++n) acc += dy.at(n, o);
    g.db[static_cast<size_t>(o)] = acc;
  }
  return g;
}

// ---- loss: torch.nn.CrossEntropyLoss(label_smoothing=s), reduction mean ----------
//   loss_i = (1 - s) * (-log p_{y_i}) + s * mean_k(-log p_k)

struct XentResult {
  double mean_loss = 0.0;
  Mat dlogits;                      // d(mean loss) / d(logits)
  std::vector<int32_t> predictions;  // per-row argmax (first maximum)
};

inline XentResult softmax_xent(const Mat& logits, const std::vector<int32_t>& labels, double smoothing) {
  require(static_cast<int64_t>(labels.size()) == logits.rows, "xent labels size");
  const int64_t N = logits.rows, K = logits.cols;
  XentResult r{0.0, Mat(N, K), std::vector<int32_t>(static_cast<size_t>(N))};
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t label = labels[static_cast<size_t>(n)];
    require(label >= 0 && label < K, "xent label out of range");
    double zmax = logits.at(n, 0);
    int32_t amax = 0;
    for (int64_t k = 1; k < K; ++k)
      if (logits.at(n, k) > zmax) { zmax = logits.at(n, k); amax = static_cast<int32_t>(k); }
    double sum = 0.0;
    for (int64_t k = 0; k < K; ++k) sum += std::exp(logits.at(n, k) - zmax);
    const double lse = zmax + std::log(sum);
    double nll = 0.0, mean_neg_logp = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double logp = logits.at(n, k) - lse;
      if (k == label) nll = -logp;
      mean_neg_logp += -logp / static_cast<double>(K);
      const double q = (k == label ? 1.0 - smoothing : 0.0) + smoothing / static_cast<double>(K);
      r.dlogits.at(n, k) = (std::exp(logp) - q) / static_cast<double>(N);
    }
    total += (1.0 - smoothing) * nll + smoothing * mean_neg_logp;
    r.predictions[static_cast<size_t>(n)] = amax;
  }
  r.mean_loss = total / static_cast<double>(N);
  return r;
}

// ---- optimizers, as torch.optim (1.13, single-tensor path) --------------------------

struct AdamState {
  Vec m, v;
  int64_t step = 0;
};

inline void adam_step(Vec& params, const Vec& grads, AdamState& st, double lr, double beta1,
                      double beta2, double eps, double weight_decay) {
  if (st.m.empty()) st.m.assign(params.size(), 0.0), st.v.assign(params.size(), 0.0);
  st.step += 1;
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(st.step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(st.step));
  for (size_t i = 0; i < params.size(); ++i) {
    const double g = grads[i] + weight_decay * params[i];
    st.m[i] = beta1 * st.m[i] + (1.0 - beta1) * g;
    st.v[i] = beta2 * st.v[i] + (1.0 - beta2) * g * g;
    const double denom = std::sqrt(st.v[i]) / std::sqrt(bc2) + eps;
    params[i] -= (lr / bc1) * st.m[i] / denom;
  }
}

struct SgdState {
  Vec buf;  // empty until the first step, which sets buf = grad (PyTorch)
};

inline void sgd_step(Vec& params, const Vec& grads, SgdState& st, double lr, double momentum,
                     double dampening, double weight_decay, bool nesterov) {
  const bool first = st.buf.empty();
  if (first) st.buf.assign(params.size(), 0.0);
  for (size_t i = 0; i < params.size(); ++i) {
    double d = grads[i] + weight_decay * params[i];
    if (momentum != 0.0) {
      st.buf[i] = first ? d : momentum * st.buf[i] + (1.0 - dampening) * d;
      d = nesterov ? d + momentum * st.buf[i] : st.buf[i];
    }
    params[i] -= lr * d;
  }
}

}  // namespace rd::ref
