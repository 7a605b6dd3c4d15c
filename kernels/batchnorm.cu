// Batch norm as kernels (the same path serves local BN and SyncBatchNorm, whose
// per-channel sums are all-reduced between the reduction and the finalize step).
// Per-channel sums: float within a thread, double across threads and blocks.
#include <algorithm>

#include "common.cuh"
#include "resnet_ddp/math/activation.h"
#include "resnet_ddp/math/batchnorm.h"

namespace rd::kern {
namespace {

// Per-element terms summed for the forward statistics: d and d^2 with
// d = x - shift[c] (shift null: 0).
//
// Note [Shifted batch-norm sums]
// Sum(x^2) - Sum(x)^2 / n loses every digit when the mean is large against the
// spread. Summing d = x - shift instead, with shift the running mean (the same
// on every rank, so SyncBN's sums still add up), keeps float partial sums near
// the spread of x rather than its mean; the variance is unchanged by the shift.
template <class T> struct ForwardTerms {
  const T* x;
  const float* shift;
  __device__ void operator()(int64_t i, int64_t c, float& a, float& b) const {
    const float v = to_f(x[i]) - (shift ? shift[c] : 0.f);
    a += v;
    b += v * v;
  }
};

// Backward: g (dy masked by the fused ReLU) and g * xhat.
template <class T> struct BackwardTerms {
  const T* x;
  const T* y;
  const T* dy;
  bool relu;
  const float* mean;
  const float* invstd;
  __device__ void operator()(int64_t i, int64_t c, float& a, float& b) const {
    float g = to_f(dy[i]);
    if (relu) g = math::relu_backward(to_f(y[i]), g);
    const float xhat = (to_f(x[i]) - mean[c]) * invstd[c];
    a += g;
    b += g * xhat;
  }
};

constexpr int kRowsPerBlock = 8;

// NHWC: 32 consecutive channels per warp (coalesced), 8 rows per block, grid.y
// blocks share the rows; partial sums meet in double atomics.
template <class Terms>
__global__ void sums_nhwc_kernel(Terms t, int64_t rows, int64_t C, double* sums) {
  __shared__ float sa[kRowsPerBlock][33], sb[kRowsPerBlock][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  float a = 0.f, b = 0.f;
  if (c < C)
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock + ty; r < rows;
         r += static_cast<int64_t>(gridDim.y) * kRowsPerBlock)
      t(r * C + c, c, a, b);
  sa[ty][tx] = a;
  sb[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && c < C) {
    double A = 0.0, B = 0.0;
    for (int k = 0; k < kRowsPerBlock; ++k) {
      A += sa[k][tx];
      B += sb[k][tx];
    }
    atomicAdd(&sums[c], A);
    atomicAdd(&sums[C + c], B);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// NCHW: block (channel, chunk); threads walk the channel's N planes.
template <class Terms>
__global__ void sums_nchw_kernel(Terms t, int64_t N, int64_t C, int64_t HW, double* sums) {
  const int64_t c = blockIdx.x;
  const int64_t total = N * HW;
  float a = 0.f, b = 0.f;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < total;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    const int64_t n = j / HW, s = j - n * HW;
    t((n * C + c) * HW + s, c, a, b);
  }
  __shared__ float sa[32], sb[32];
  a = warp_sum(a);
  b = warp_sum(b);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double A = 0.0, B = 0.0;
    for (int k = 0; k < static_cast<int>(blockDim.x >> 5); ++k) {
      A += sa[k];
      B += sb[k];
    }
    atomicAdd(&sums[c], A);
    atomicAdd(&sums[C + c], B);
  }
}

template <class Terms> void launch_sums(const ActDesc& d, Terms t, double* sums, cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(sums, 0, sizeof(double) * 2 * static_cast<size_t>(d.c), s);
  if (e != cudaSuccess) RD_FAIL("cudaMemsetAsync(bn sums) failed: " << cudaGetErrorString(e));
  if (!d.count()) return;
  if (d.nhwc) {
    const int64_t rows = d.n * d.h * d.w;
    const unsigned gx = static_cast<unsigned>((d.c + 31) / 32);
    // At least ~16 rows per thread, and about 2048 blocks in all.
    int64_t gy = (rows + kRowsPerBlock * 16 - 1) / (kRowsPerBlock * 16);
    const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(2048, kMaxGridBlocks) / gx);
    gy = std::max<int64_t>(1, std::min(gy, std::min<int64_t>(cap, 65535)));
    RD_LAUNCH(sums_nhwc_kernel<Terms>, dim3(gx, static_cast<unsigned>(gy)), dim3(32, kRowsPerBlock), 0, s)(
        t, rows, d.c, sums);
  } else {
    const int64_t per_channel = d.n * d.h * d.w;
    int64_t gy = (per_channel + kThreads * 16 - 1) / (kThreads * 16);
    const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(2048, kMaxGridBlocks) / d.c);
    gy = std::max<int64_t>(1, std::min(gy, std::min<int64_t>(cap, 65535)));
    RD_CHECK(d.c <= 2147483647, "bn: too many channels");
    RD_LAUNCH(sums_nchw_kernel<Terms>, dim3(static_cast<unsigned>(d.c), static_cast<unsigned>(gy)), kThreads, 0, s)(
        t, d.n, d.c, d.h * d.w, sums);
  }
}

__global__ void pack_kernel(const double* sums, int64_t C, double count, double* packed) {
  RD_GRID_STRIDE(i, 2 * C + 1) packed[i] = i < 2 * C ? sums[i] : count;
}

__global__ void finalize_forward_kernel(int64_t C, const double* sums, double count,
                                        const double* packed, const float* gamma, const float* beta,
                                        float* running_mean, float* running_var, float momentum,
                                        float eps, float* saved_mean, float* saved_invstd,
                                        float* scale_shift) {
  RD_GRID_STRIDE(c, C) {
    double sum, sumsq, n;
    if (packed) {
      sum = packed[c];
      sumsq = packed[C + c];
      n = packed[2 * C];
    } else {
      sum = sums[c];
      sumsq = sums[C + c];
      n = count;
    }
    // The shift the sums kernel used: running_mean before this update.
    const double sums_shift = running_mean ? static_cast<double>(running_mean[c]) : 0.0;
    float mean, var;
    math::bn_stats_from_shifted_sums(sums_shift, sum, sumsq, n, mean, var);
    const float invstd = math::bn_invstd(var, eps);
    saved_mean[c] = mean;
    saved_invstd[c] = invstd;
    if (running_mean && running_var)
      math::bn_update_running(running_mean[c], running_var[c], mean, var, n, momentum);
    float scale, shift;
    math::bn_scale_shift(gamma ? gamma[c] : 1.f, beta ? beta[c] : 0.f, mean, invstd, scale, shift);
    scale_shift[c] = scale;
    scale_shift[C + c] = shift;
  }
}

__global__ void scale_shift_eval_kernel(int64_t C, const float* gamma, const float* beta,
                                        const float* running_mean, const float* running_var,
                                        float eps, float* scale_shift) {
  RD_GRID_STRIDE(c, C) {
    float scale, shift;
    math::bn_scale_shift(gamma ? gamma[c] : 1.f, beta ? beta[c] : 0.f, running_mean[c],
                         math::bn_invstd(running_var[c], eps), scale, shift);
    scale_shift[c] = scale;
    scale_shift[C + c] = shift;
  }
}

template <class T>
__global__ void apply_kernel(ActDesc d, const T* x, const float* scale_shift, bool relu, T* y) {
  RD_GRID_STRIDE(i, d.count()) {
    const int64_t c = act_channel(d, i);
    const float v = to_f(x[i]) * scale_shift[c] + scale_shift[d.c + c];
    y[i] = from_f<T>(relu ? math::relu_forward(v) : v);
  }
}

__global__ void param_grads_kernel(int64_t C, const double* sums, float* dgamma, float* dbeta,
                                   bool accumulate) {
  RD_GRID_STRIDE(c, C) {
    const float dg = static_cast<float>(sums[C + c]), db = static_cast<float>(sums[c]);
    if (dgamma) dgamma[c] = accumulate ? dgamma[c] + dg : dg;
    if (dbeta) dbeta[c] = accumulate ? dbeta[c] + db : db;
  }
}

__global__ void finalize_backward_kernel(int64_t C, const double* sums, double count,
                                         const double* packed, float* means) {
  RD_GRID_STRIDE(c, C) {
    if (packed) {
      const double n = packed[2 * C];
      means[c] = static_cast<float>(packed[c] / n);
      means[C + c] = static_cast<float>(packed[C + c] / n);
    } else {
      means[c] = static_cast<float>(sums[c] / count);
      means[C + c] = static_cast<float>(sums[C + c] / count);
    }
  }
}

template <class T>
__global__ void backward_dx_kernel(ActDesc d, const T* x, const T* y, const T* dy, bool relu,
                                   const float* gamma, const float* mean, const float* invstd,
                                   const float* means, T* dx) {
  RD_GRID_STRIDE(i, d.count()) {
    const int64_t c = act_channel(d, i);
    float g = to_f(dy[i]);
    if (relu) g = math::relu_backward(to_f(y[i]), g);
    dx[i] = from_f<T>(math::bn_backward_dx(g, to_f(x[i]), mean[c], invstd[c],
                                           gamma ? gamma[c] : 1.f, means[c], means[d.c + c]));
  }
}

unsigned channel_grid(int64_t c) { return grid_for(c); }

}  // namespace

void bn_sums_forward(const ActDesc& d, const void* x, const float* shift, double* sums, cudaStream_t s) {
  dispatch_float(d.dtype, "bn_sums_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_sums(d, ForwardTerms<T>{static_cast<const T*>(x), shift}, sums, s);
  });
  RD_LAUNCH_CHECK("bn_sums_forward");
}

void bn_sums_backward(const ActDesc& d, const void* x, const void* y, const void* dy, bool relu,
                      const float* mean, const float* invstd, double* sums, cudaStream_t s) {
  dispatch_float(d.dtype, "bn_sums_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_sums(d,
                BackwardTerms<T>{static_cast<const T*>(x), static_cast<const T*>(y),
                                 static_cast<const T*>(dy), relu, mean, invstd},
                sums, s);
  });
  RD_LAUNCH_CHECK("bn_sums_backward");
}

void bn_pack_sums(const double* sums, int64_t c, double count, double* packed, cudaStream_t s) {
  RD_LAUNCH(pack_kernel, grid_for(2 * c + 1), kThreads, 0, s)(sums, c, count, packed);
  RD_LAUNCH_CHECK("bn_pack_sums");
}

void bn_finalize_forward(int64_t c, const double* sums, double count, const double* packed,
                         const float* gamma, const float* beta, float* running_mean,
                         float* running_var, float momentum, float eps, float* saved_mean,
                         float* saved_invstd, float* scale_shift, cudaStream_t s) {
  RD_LAUNCH(finalize_forward_kernel, channel_grid(c), kThreads, 0, s)(c, sums, count, packed, gamma, beta,
                                                               running_mean, running_var, momentum,
                                                               eps, saved_mean, saved_invstd,
                                                               scale_shift);
  RD_LAUNCH_CHECK("bn_finalize_forward");
}

void bn_scale_shift_eval(int64_t c, const float* gamma, const float* beta, const float* running_mean,
                         const float* running_var, float eps, float* scale_shift, cudaStream_t s) {
  RD_LAUNCH(scale_shift_eval_kernel, channel_grid(c), kThreads, 0, s)(c, gamma, beta, running_mean,
                                                               running_var, eps, scale_shift);
  RD_LAUNCH_CHECK("bn_scale_shift_eval");
}

void bn_apply(const ActDesc& d, const void* x, const float* scale_shift, bool relu, void* y,
              cudaStream_t s) {
  if (!d.count()) return;
  dispatch_float(d.dtype, "bn_apply", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(apply_kernel<T>, grid_for(d.count()), kThreads, 0, s)(d, static_cast<const T*>(x), scale_shift,
                                                             relu, static_cast<T*>(y));
  });
  RD_LAUNCH_CHECK("bn_apply");
}

void bn_param_grads(int64_t c, const double* sums, float* dgamma, float* dbeta, bool accumulate,
                    cudaStream_t s) {
  RD_LAUNCH(param_grads_kernel, channel_grid(c), kThreads, 0, s)(c, sums, dgamma, dbeta, accumulate);
  RD_LAUNCH_CHECK("bn_param_grads");
}

void bn_finalize_backward(int64_t c, const double* sums, double count, const double* packed,
                          float* means, cudaStream_t s) {
  RD_LAUNCH(finalize_backward_kernel, channel_grid(c), kThreads, 0, s)(c, sums, count, packed, means);
  RD_LAUNCH_CHECK("bn_finalize_backward");
}

void bn_backward_dx(const ActDesc& d, const void* x, const void* y, const void* dy, bool relu,
                    const float* gamma, const float* mean, const float* invstd, const float* means,
                    void* dx, cudaStream_t s) {
  if (!d.count()) return;
  dispatch_float(d.dtype, "bn_backward_dx", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(backward_dx_kernel<T>, grid_for(d.count()), kThreads, 0, s)(
        d, static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), relu, gamma,
        mean, invstd, means, static_cast<T*>(dx));
  });
  RD_LAUNCH_CHECK("bn_backward_dx");
}

}  // namespace rd::kern
