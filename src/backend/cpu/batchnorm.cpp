// Batch norm on the CPU, written by hand rather than with oneDNN because
// SyncBatchNorm needs to sum the per-channel statistics across ranks between the
// reduction and the normalisation (forward) and between the gradient reduction and
// dx (backward); oneDNN's primitive fuses those steps. All reductions accumulate in
// double (the ops are memory-bound, so this costs nothing measurable).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/layout.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/math/activation.h"
#include "resnet_ddp/math/batchnorm.h"

namespace rd::cpu {

std::vector<double>& CpuBackend::bn_scratch(size_t n) {
  if (bn_scratch_.size() < n) bn_scratch_.resize(n);
  return bn_scratch_;
}

namespace {

// out[c] = sum over all (n, h, w) of f(index, c), two sums at once (a, b).
// NHWC: rows of C contiguous values, split across threads. Each thread sums
// blocks of kRowBlock rows in float (16-wide vectors along C), then adds each
// block into its double accumulators: float error stays at block scale and the
// totals are exact to double precision.
// NCHW: each channel's planes are contiguous, so split channels across threads.
// nChw16c/nChw8c: each channel block is a set of contiguous planes of 16- or 8-wide
// rows, so split blocks across threads and sum rows like NHWC.
constexpr int64_t kRowBlock = 32;

// The channel-blocked walk, with the block width B a compile-time constant so the
// inner loop is one vector (B = 16: nChw16c on AVX-512, B = 8: nChw8c on AVX2).
template <int64_t B, class F>
void channel_sums_blocked(const Dims& d, int threads, double* out_a, double* out_b, F f) {
  const int64_t HW = d.h * d.w, blocks = d.c / B;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t cb = 0; cb < blocks; ++cb) {
    double a[B] = {}, b[B] = {};
    for (int64_t n = 0; n < d.n; ++n) {
      const int64_t plane = (n * blocks + cb) * HW * B;
      for (int64_t r0 = 0; r0 < HW; r0 += kRowBlock) {
        float fa[B] = {}, fb[B] = {};
        const int64_t r_end = std::min(HW, r0 + kRowBlock);
        for (int64_t r = r0; r < r_end; ++r) {
#pragma omp simd
          for (int64_t l = 0; l < B; ++l) {
            float va, vb;
            f(plane + r * B + l, cb * B + l, va, vb);
            fa[l] += va;
            fb[l] += vb;
          }
        }
        for (int64_t l = 0; l < B; ++l) {
          a[l] += fa[l];
          b[l] += fb[l];
        }
      }
    }
    for (int64_t l = 0; l < B; ++l) {
      out_a[cb * B + l] = a[l];
      out_b[cb * B + l] = b[l];
    }
  }
}

template <class F>
void channel_sums(const Dims& d, Layout layout, double* partial, int threads, double* out_a,
                  double* out_b, F f) {
  const int64_t C = d.c, HW = d.h * d.w, rows = d.n * HW;
  if (layout == Layout::NCHW16C) {
    channel_sums_blocked<16>(d, threads, out_a, out_b, f);
  } else if (layout == Layout::NCHW8C) {
    channel_sums_blocked<8>(d, threads, out_a, out_b, f);
  } else if (layout == Layout::NHWC) {
    const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      double* a = partial + static_cast<size_t>(t) * 2 * C;
      double* b = a + C;
      std::fill(a, a + 2 * C, 0.0);
      thread_local std::vector<float> block_sums;
      if (block_sums.size() < static_cast<size_t>(2 * C)) block_sums.resize(static_cast<size_t>(2 * C));
      float* fa = block_sums.data();
      float* fb = fa + C;
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        std::fill(fa, fa + 2 * C, 0.f);
        const int64_t r_end = std::min(rows, (blk + 1) * kRowBlock);
        for (int64_t r = blk * kRowBlock; r < r_end; ++r) {
          const int64_t base = r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            float va, vb;
            f(base + c, c, va, vb);
            fa[c] += va;
            fb[c] += vb;
          }
        }
        for (int64_t c = 0; c < C; ++c) {
          a[c] += fa[c];
          b[c] += fb[c];
        }
      }
    }
    const int nt = threads;
    for (int64_t c = 0; c < C; ++c) {
      double sa = 0, sb = 0;
      for (int t = 0; t < nt; ++t) {
        sa += partial[static_cast<size_t>(t) * 2 * C + c];
        sb += partial[static_cast<size_t>(t) * 2 * C + C + c];
      }
      out_a[c] = sa;
      out_b[c] = sb;
    }
  } else {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t c = 0; c < C; ++c) {
      double sa = 0, sb = 0;
      for (int64_t n = 0; n < d.n; ++n) {
        const int64_t base = (n * C + c) * HW;
#pragma omp simd reduction(+ : sa, sb)
        for (int64_t p = 0; p < HW; ++p) {
          float va, vb;
          f(base + p, c, va, vb);
          sa += va;
          sb += vb;
        }
      }
      out_a[c] = sa;
      out_b[c] = sb;
    }
  }
}

template <int64_t B, class G>
void for_each_element_blocked(const Dims& d, int threads, G g) {
  const int64_t HW = d.h * d.w, blocks = d.c / B;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t cb = 0; cb < blocks; ++cb) {
      const int64_t plane = (n * blocks + cb) * HW * B;
      for (int64_t r = 0; r < HW; ++r) {
#pragma omp simd
        for (int64_t l = 0; l < B; ++l) g(plane + r * B + l, cb * B + l);
      }
    }
}

// Applies g(index, c) to every element, parallel over the outer dimension.
template <class G>
void for_each_element(const Dims& d, Layout layout, int threads, G g) {
  const int64_t C = d.c, HW = d.h * d.w;
  if (layout == Layout::NCHW16C) {
    for_each_element_blocked<16>(d, threads, g);
  } else if (layout == Layout::NCHW8C) {
    for_each_element_blocked<8>(d, threads, g);
  } else if (layout == Layout::NHWC) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < d.n * HW; ++r) {
      const int64_t base = r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) g(base + c, c);
    }
  } else {
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t base = (n * C + c) * HW;
#pragma omp simd
        for (int64_t p = 0; p < HW; ++p) g(base + p, c);
      }
  }
}

// y = x * scale[c] + shift[c], then ReLU when fused (forward in train and eval mode).
void apply_scale_shift(const Dims& d, Layout layout, int threads, const float* xs, float* ys,
                       const float* scale, const float* shift, bool relu) {
  if (relu)
    for_each_element(d, layout, threads, [=](int64_t i, int64_t c) {
      ys[i] = math::relu_forward(xs[i] * scale[c] + shift[c]);
    });
  else
    for_each_element(d, layout, threads,
                     [=](int64_t i, int64_t c) { ys[i] = xs[i] * scale[c] + shift[c]; });
}

// The walk a tensor's layout needs (checks the channel blocks of nChw16c/nChw8c).
Layout bn_layout(const Tensor& x) {
  if (is_blocked(x)) return x.layout;
  RD_CHECK(x.layout == Layout::NHWC || x.layout == Layout::NCHW,
           "batch norm: unsupported layout " << layout_name(x.layout));
  return x.layout;
}

}  // namespace

void CpuBackend::batchnorm_forward_train_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y,
                                              BatchNormSaved& saved) {
  const float *gamma = a.gamma, *beta = a.beta;
  float *running_mean = a.running_mean, *running_var = a.running_var;
  const float momentum = a.momentum, eps = a.eps;
  const bool relu = a.relu;
  ChannelReducer* sync = a.sync;
  const Dims d = dims_of(x);
  const Layout layout = bn_layout(x);
  const int64_t C = d.c;
  std::vector<double>& s = bn_scratch(static_cast<size_t>(threads_ + 2) * 2 * C + 2);
  double* sum = s.data();
  double* sumsq = sum + C;
  double* partial = sumsq + C;
  const float* xs = x.f32();
  channel_sums(d, layout, partial, threads_, sum, sumsq,
               [xs](int64_t i, int64_t, float& a, float& b) {
                 const float v = xs[i];
                 a = v;
                 b = v * v;
               });
  double count = static_cast<double>(d.n * d.h * d.w);
  if (sync) {
    // One all-reduce of [sum | sumsq | count] in double: exact even when ranks
    // hold unequal batches (sum and sumsq sit contiguously in the scratch).
    std::vector<double> packed(sum, sum + 2 * C);
    packed.push_back(count);
    sync->allreduce_sum(packed.data(), packed.size());
    std::copy(packed.begin(), packed.begin() + 2 * C, sum);
    count = packed[static_cast<size_t>(2 * C)];
  }
  RD_CHECK(count > 0, "batchnorm: empty batch");
  saved.count = count;
  // Per-channel scale and shift in float, packed after the double sums.
  std::vector<float>& ss = bn_scratch_f_;
  ss.resize(static_cast<size_t>(2 * C + 1));
  float* scale = ss.data();
  float* shift = scale + C;
  for (int64_t c = 0; c < C; ++c) {
    float mean, var;
    math::bn_stats_from_sums(sum[c], sumsq[c], count, mean, var);
    const float invstd = math::bn_invstd(var, eps);
    saved.mean[c] = mean;
    saved.invstd[c] = invstd;
    if (running_mean && running_var)
      math::bn_update_running(running_mean[c], running_var[c], mean, var, count, momentum);
    math::bn_scale_shift(gamma[c], beta[c], mean, invstd, scale[c], shift[c]);
  }
  float* ys = y.f32();
  apply_scale_shift(d, layout, threads_, xs, ys, scale, shift, relu);
}

void CpuBackend::batchnorm_forward_eval_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y) {
  const float *gamma = a.gamma, *beta = a.beta;
  const float *running_mean = a.running_mean, *running_var = a.running_var;
  const float eps = a.eps;
  const bool relu = a.relu;
  const Dims d = dims_of(x);
  const Layout layout = bn_layout(x);
  std::vector<float>& ss = bn_scratch_f_;
  ss.resize(static_cast<size_t>(2 * d.c + 1));
  float* scale = ss.data();
  float* shift = scale + d.c;
  for (int64_t c = 0; c < d.c; ++c)
    math::bn_scale_shift(gamma[c], beta[c], running_mean[c], math::bn_invstd(running_var[c], eps),
                         scale[c], shift[c]);
  const float* xs = x.f32();
  float* ys = y.f32();
  apply_scale_shift(d, layout, threads_, xs, ys, scale, shift, relu);
}

void CpuBackend::batchnorm_backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy,
                                         const BatchNormArgs& a, const BatchNormSaved& saved, Tensor& dx,
                                         const BatchNormGrads& grads) {
  const float* gamma = a.gamma;
  const bool relu = a.relu, accumulate = grads.accumulate;
  ChannelReducer* sync = a.sync;
  float *dgamma = grads.dgamma, *dbeta = grads.dbeta;
  const Dims d = dims_of(x);
  const Layout layout = bn_layout(x);
  const int64_t C = d.c;
  std::vector<double>& s = bn_scratch(static_cast<size_t>(threads_ + 2) * 2 * C + 2);
  double* sum_dy = s.data();
  double* sum_dy_xmu = sum_dy + C;
  double* partial = sum_dy_xmu + C;
  const float* xs = x.f32();
  const float* ys = y.f32();
  const float* g = dy.f32();
  const float* mean = saved.mean;
  if (relu)
    channel_sums(d, layout, partial, threads_, sum_dy, sum_dy_xmu,
                 [=](int64_t i, int64_t c, float& a, float& b) {
                   const float gi = math::relu_backward(ys[i], g[i]);
                   a = gi;
                   b = gi * (xs[i] - mean[c]);
                 });
  else
    channel_sums(d, layout, partial, threads_, sum_dy, sum_dy_xmu,
                 [=](int64_t i, int64_t c, float& a, float& b) {
                   a = g[i];
                   b = g[i] * (xs[i] - mean[c]);
                 });
  // [sum_dy | sum_dy_xhat] in float, as before SyncBN existed (the dgamma/dbeta
  // values stay bit-identical), all-reduced in double.
  std::vector<double> red(static_cast<size_t>(2 * C));
  for (int64_t c = 0; c < C; ++c) {
    red[static_cast<size_t>(c)] = static_cast<float>(sum_dy[c]);
    red[static_cast<size_t>(C + c)] = static_cast<float>(sum_dy_xmu[c] * saved.invstd[c]);
  }
  // dgamma/dbeta are this rank's own sums: DDP averages them like every other
  // gradient (taking them after the all-reduce would scale them by the world size).
  for (int64_t c = 0; c < C; ++c) {
    const float db = static_cast<float>(red[static_cast<size_t>(c)]);
    const float dg = static_cast<float>(red[static_cast<size_t>(C + c)]);
    if (dbeta) dbeta[c] = accumulate ? dbeta[c] + db : db;
    if (dgamma) dgamma[c] = accumulate ? dgamma[c] + dg : dg;
  }
  if (sync) sync->allreduce_sum(red.data(), red.size());
  // dx = gamma*invstd * (dy - mean_dy - xhat*mean_dy_xhat) is affine in (dy, x) per
  // channel: dx = k*dy + p*x + q. Three per-channel vectors instead of six keep the
  // element loop to two FMAs (it runs on every activation of the network).
  std::vector<float>& f = bn_scratch_f_;
  f.resize(static_cast<size_t>(3 * C));
  float* k = f.data();
  float* p = k + C;
  float* q = p + C;
  for (int64_t c = 0; c < C; ++c)
    math::bn_backward_coefficients(gamma[c], mean[c], saved.invstd[c],
                                   red[static_cast<size_t>(c)] / saved.count,
                                   red[static_cast<size_t>(C + c)] / saved.count, k[c], p[c], q[c]);
  float* out = dx.f32();
  if (relu)
    for_each_element(d, layout, threads_, [=](int64_t i, int64_t c) {
      out[i] = math::bn_backward_dx_affine(math::relu_backward(ys[i], g[i]), xs[i], k[c], p[c], q[c]);
    });
  else
    for_each_element(d, layout, threads_, [=](int64_t i, int64_t c) {
      out[i] = math::bn_backward_dx_affine(g[i], xs[i], k[c], p[c], q[c]);
    });
}

}  // namespace rd::cpu
