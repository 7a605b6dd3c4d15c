// Max pool (with argmax for backward) and global average pool.
#include "common.cuh"

namespace rd::kern {
namespace {

// PyTorch semantics: padding is -inf, the first maximum in window order wins,
// NaN propagates (and stops the search).
template <class T>
__global__ void maxpool_fwd_kernel(ActDesc xd, const T* x, ActDesc yd, T* y, int k, int stride,
                                   int pad, int32_t* argmax) {
  RD_GRID_STRIDE(j, yd.count()) {
    int64_t n, c, oh, ow;
    act_coords(yd, j, n, c, oh, ow);
    float best = 0.f;
    int64_t best_i = -1;
    for (int kh = 0; kh < k; ++kh) {
      const int64_t ih = oh * stride - pad + kh;
      if (ih < 0 || ih >= xd.h) continue;
      bool stop = false;
      for (int kw = 0; kw < k; ++kw) {
        const int64_t iw = ow * stride - pad + kw;
        if (iw < 0 || iw >= xd.w) continue;
        const int64_t xi = act_offset(xd, n, c, ih, iw);
        const float v = to_f(x[xi]);
        if (best_i < 0 || v > best || isnan(v)) {
          best = v;
          best_i = xi;
          if (isnan(v)) {
            stop = true;
            break;
          }
        }
      }
      if (stop) break;
    }
    y[j] = from_f<T>(best);
    argmax[j] = static_cast<int32_t>(best_i);
  }
}

template <class T>
__global__ void maxpool_bwd_kernel(ActDesc dyd, const T* dy, ActDesc dxd, T* dx, int k, int stride,
                                   int pad, const int32_t* argmax) {
  RD_GRID_STRIDE(i, dxd.count()) {
    int64_t n, c, ih, iw;
    act_coords(dxd, i, n, c, ih, iw);
    // Windows containing ih: oh * stride - pad <= ih <= oh * stride - pad + k - 1.
    const int64_t lo_h_num = ih + pad - k + 1, lo_w_num = iw + pad - k + 1;
    const int64_t oh_lo = lo_h_num <= 0 ? 0 : (lo_h_num + stride - 1) / stride;
    const int64_t ow_lo = lo_w_num <= 0 ? 0 : (lo_w_num + stride - 1) / stride;
    const int64_t oh_hi = min((ih + pad) / stride, dyd.h - 1);
    const int64_t ow_hi = min((iw + pad) / stride, dyd.w - 1);
    float acc = 0.f;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t j = act_offset(dyd, n, c, oh, ow);
        if (argmax[j] == i) acc += to_f(dy[j]);
      }
    dx[i] = from_f<T>(acc);
  }
}

template <class T> __global__ void gap_fwd_kernel(ActDesc xd, const T* x, float* y) {
  RD_GRID_STRIDE(j, xd.n * xd.c) {
    const int64_t n = j / xd.c, c = j % xd.c;
    float acc = 0.f;
    for (int64_t h = 0; h < xd.h; ++h)
      for (int64_t w = 0; w < xd.w; ++w) acc += to_f(x[act_offset(xd, n, c, h, w)]);
    y[j] = acc / static_cast<float>(xd.h * xd.w);
  }
}

template <class T> __global__ void gap_bwd_kernel(const float* dy, ActDesc dxd, T* dx) {
  const float inv = 1.f / static_cast<float>(dxd.h * dxd.w);
  RD_GRID_STRIDE(i, dxd.count()) {
    int64_t n, c, h, w;
    act_coords(dxd, i, n, c, h, w);
    dx[i] = from_f<T>(dy[n * dxd.c + c] * inv);
  }
}

}  // namespace

void maxpool_forward(const ActDesc& xd, const void* x, const ActDesc& yd, void* y, int kernel,
                     int stride, int pad, int32_t* argmax, cudaStream_t s) {
  RD_CHECK(xd.count() < 2147483647LL, "maxpool: input too large for 32-bit indices");
  if (!yd.count()) return;
  dispatch_float(xd.dtype, "maxpool_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(maxpool_fwd_kernel<T>, grid_for(yd.count()), kThreads, 0, s)(
        xd, static_cast<const T*>(x), yd, static_cast<T*>(y), kernel, stride, pad, argmax);
  });
  RD_LAUNCH_CHECK("maxpool_forward");
}

void maxpool_backward(const ActDesc& dyd, const void* dy, const ActDesc& dxd, void* dx, int kernel,
                      int stride, int pad, const int32_t* argmax, cudaStream_t s) {
  if (!dxd.count()) return;
  dispatch_float(dxd.dtype, "maxpool_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(maxpool_bwd_kernel<T>, grid_for(dxd.count()), kThreads, 0, s)(
        dyd, static_cast<const T*>(dy), dxd, static_cast<T*>(dx), kernel, stride, pad, argmax);
  });
  RD_LAUNCH_CHECK("maxpool_backward");
}

void global_avgpool_forward(const ActDesc& xd, const void* x, float* y, cudaStream_t s) {
  if (xd.n * xd.c == 0) return;
  dispatch_float(xd.dtype, "global_avgpool_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(gap_fwd_kernel<T>, grid_for(xd.n * xd.c), kThreads, 0, s)(xd, static_cast<const T*>(x), y);
  });
  RD_LAUNCH_CHECK("global_avgpool_forward");
}

void global_avgpool_backward(const float* dy, const ActDesc& dxd, void* dx, cudaStream_t s) {
  if (!dxd.count()) return;
  dispatch_float(dxd.dtype, "global_avgpool_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(gap_bwd_kernel<T>, grid_for(dxd.count()), kThreads, 0, s)(dy, dxd, static_cast<T*>(dx));
  });
  RD_LAUNCH_CHECK("global_avgpool_backward");
}

}  // namespace rd::kern
