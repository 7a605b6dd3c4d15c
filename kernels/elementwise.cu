// Elementwise kernels: fill, ReLU, residual add (+ReLU), accumulate, scaling
// with the inf/nan check, layout/dtype conversions and image input conversion.
#include <string>

#include "common.cuh"
#include "resnet_ddp/math/activation.h"
#include "resnet_ddp/math/image.h"

namespace rd::kern {

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail_at(file, line, std::string("CUDA kernel launch '") + kernel + "' failed: " +
                            cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

namespace {

__global__ void fill_kernel(float* dst, float value, int64_t n) {
  RD_GRID_STRIDE(i, n) dst[i] = value;
}

template <class T> __global__ void relu_fwd_kernel(const T* x, T* y, int64_t n) {
  RD_GRID_STRIDE(i, n) y[i] = from_f<T>(math::relu_forward(to_f(x[i])));
}

template <class T> __global__ void relu_bwd_kernel(const T* y, const T* dy, T* dx, int64_t n) {
  RD_GRID_STRIDE(i, n) dx[i] = from_f<T>(math::relu_backward(to_f(y[i]), to_f(dy[i])));
}

template <class T> __global__ void add_kernel(const T* a, const T* b, T* y, int64_t n, bool relu) {
  RD_GRID_STRIDE(i, n) {
    const float av = to_f(a[i]), bv = to_f(b[i]);
    y[i] = from_f<T>(relu ? math::add_relu_forward(av, bv) : av + bv);
  }
}

template <class T> __global__ void accumulate_kernel(const T* src, T* dst, int64_t n) {
  RD_GRID_STRIDE(i, n) dst[i] = from_f<T>(to_f(dst[i]) + to_f(src[i]));
}

__global__ void scale_kernel(float* data, float factor, int64_t n) {
  RD_GRID_STRIDE(i, n) data[i] *= factor;
}

__global__ void scale_check_kernel(float* data, float factor, int64_t n, int* nonfinite) {
  bool bad = false;
  RD_GRID_STRIDE(i, n) {
    float v = data[i];
    if (factor != 1.f) data[i] = v = v * factor;
    bad |= !isfinite(v);
  }
  // One store per warp that saw a bad value: cheap, and any store suffices.
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *nonfinite = 1;
}

template <class T> __global__ void nchw_to_act_kernel(const float* src, ActDesc d, T* dst) {
  RD_GRID_STRIDE(i, d.count()) {
    int64_t n, c, h, w;
    act_coords(d, i, n, c, h, w);
    dst[i] = from_f<T>(src[((n * d.c + c) * d.h + h) * d.w + w]);
  }
}

template <class T> __global__ void act_to_nchw_kernel(ActDesc d, const T* src, float* dst) {
  RD_GRID_STRIDE(i, d.count()) {
    int64_t n, c, h, w;
    act_coords(d, i, n, c, h, w);
    dst[((n * d.c + c) * d.h + h) * d.w + w] = to_f(src[i]);
  }
}

struct Rgb {
  float v[3];
};

template <class T>
__global__ void images_kernel(const uint8_t* src, ActDesc d, T* dst, Rgb mean, Rgb std) {
  RD_GRID_STRIDE(i, d.count()) {
    int64_t n, c, h, w;
    act_coords(d, i, n, c, h, w);
    const uint8_t v = src[((n * d.h + h) * d.w + w) * 3 + c];
    dst[i] = from_f<T>(math::image_u8_to_input(v, mean.v[c], std.v[c]));
  }
}

// MixUp / CutMix with the batch rolled by one; one thread per destination element.
template <class T>
__global__ void mix_images_kernel(const T* src, ActDesc d, T* dst, math::ImageMix mix, float partner_w) {
  RD_GRID_STRIDE(i, d.count()) {
    int64_t n, c, h, w;
    act_coords(d, i, n, c, h, w);
    const int64_t partner = n == 0 ? d.n - 1 : n - 1;
    const int64_t j = d.nhwc ? ((partner * d.h + h) * d.w + w) * d.c + c : ((partner * d.c + c) * d.h + h) * d.w + w;
    const float self = to_f(src[i]), other = to_f(src[j]);
    float v;
    if (mix.cutmix)
      v = (h >= mix.y0 && h < mix.y1 && w >= mix.x0 && w < mix.x1) ? other : self;
    else
      v = math::mixup_element(self, other, mix.lambda, partner_w);
    dst[i] = from_f<T>(v);
  }
}

template <class T>
__global__ void erase_kernel(ActDesc d, T* x, const int32_t* boxes) {
  RD_GRID_STRIDE(i, d.count()) {
    int64_t n, c, h, w;
    act_coords(d, i, n, c, h, w);
    const int32_t* b = boxes + 4 * n;
    if (h >= b[0] && h < b[0] + b[2] && w >= b[1] && w < b[1] + b[3]) x[i] = from_f<T>(0.f);
  }
}

// One thread per destination element; `ohwi` selects the staged layout.
template <class T>
__global__ void stage_weight_kernel(const float* w, int64_t O, int64_t I, int64_t KH, int64_t KW,
                                    bool ohwi, T* dst) {
  RD_GRID_STRIDE(j, O * I * KH * KW) {
    const int64_t kw = j % KW, kh = (j / KW) % KH, i = (j / (KW * KH)) % I, o = j / (KW * KH * I);
    const int64_t d = ohwi ? ((o * KH + kh) * KW + kw) * I + i : j;
    dst[d] = from_f<T>(w[j]);
  }
}

template <class T>
__global__ void unstage_weight_grad_kernel(const T* src, int64_t O, int64_t I, int64_t KH,
                                           int64_t KW, bool ohwi, float* dw, bool accumulate) {
  RD_GRID_STRIDE(j, O * I * KH * KW) {
    const int64_t kw = j % KW, kh = (j / KW) % KH, i = (j / (KW * KH)) % I, o = j / (KW * KH * I);
    const int64_t s = ohwi ? ((o * KH + kh) * KW + kw) * I + i : j;
    const float v = to_f(src[s]);
    dw[j] = accumulate ? dw[j] + v : v;
  }
}

}  // namespace

void fill_f32(float* dst, float value, size_t count, cudaStream_t s) {
  if (!count) return;
  RD_LAUNCH(fill_kernel, grid_for(count), kThreads, 0, s)(dst, value, static_cast<int64_t>(count));
  RD_LAUNCH_CHECK("fill");
}

void relu_forward(DType t, const void* x, void* y, size_t count, cudaStream_t s) {
  if (!count) return;
  dispatch_float(t, "relu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(relu_fwd_kernel<T>, grid_for(count), kThreads, 0, s)(static_cast<const T*>(x),
                                                            static_cast<T*>(y), count);
  });
  RD_LAUNCH_CHECK("relu_forward");
}

void relu_backward(DType t, const void* y, const void* dy, void* dx, size_t count, cudaStream_t s) {
  if (!count) return;
  dispatch_float(t, "relu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(relu_bwd_kernel<T>, grid_for(count), kThreads, 0, s)(
        static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), count);
  });
  RD_LAUNCH_CHECK("relu_backward");
}

void add_forward(DType t, const void* a, const void* b, void* y, size_t count, bool relu,
                 cudaStream_t s) {
  if (!count) return;
  dispatch_float(t, "add_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(add_kernel<T>, grid_for(count), kThreads, 0, s)(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), count, relu);
  });
  RD_LAUNCH_CHECK("add_forward");
}

void accumulate(DType t, const void* src, void* dst, size_t count, cudaStream_t s) {
  if (!count) return;
  dispatch_float(t, "accumulate", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(accumulate_kernel<T>, grid_for(count), kThreads, 0, s)(static_cast<const T*>(src),
                                                              static_cast<T*>(dst), count);
  });
  RD_LAUNCH_CHECK("accumulate");
}

void scale_f32(float* data, float factor, size_t count, cudaStream_t s) {
  if (!count) return;
  RD_LAUNCH(scale_kernel, grid_for(count), kThreads, 0, s)(data, factor, static_cast<int64_t>(count));
  RD_LAUNCH_CHECK("scale");
}

void scale_and_check(float* data, float factor, size_t count, int* nonfinite, cudaStream_t s) {
  if (!count) return;
  RD_LAUNCH(scale_check_kernel, grid_for(count), kThreads, 0, s)(data, factor, static_cast<int64_t>(count),
                                                          nonfinite);
  RD_LAUNCH_CHECK("scale_and_check");
}

void nchw_f32_to_act(const float* src, const ActDesc& d, void* dst, cudaStream_t s) {
  if (!d.count()) return;
  dispatch_float(d.dtype, "nchw_f32_to_act", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(nchw_to_act_kernel<T>, grid_for(d.count()), kThreads, 0, s)(src, d, static_cast<T*>(dst));
  });
  RD_LAUNCH_CHECK("nchw_f32_to_act");
}

void act_to_nchw_f32(const ActDesc& d, const void* src, float* dst, cudaStream_t s) {
  if (!d.count()) return;
  dispatch_float(d.dtype, "act_to_nchw_f32", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(act_to_nchw_kernel<T>, grid_for(d.count()), kThreads, 0, s)(d, static_cast<const T*>(src), dst);
  });
  RD_LAUNCH_CHECK("act_to_nchw_f32");
}

void images_u8_to_act(const uint8_t* src, const ActDesc& d, void* dst, const float mean[3],
                      const float std[3], cudaStream_t s) {
  RD_CHECK(d.c == 3, "images_u8_to_act: expected 3 channels, got " << d.c);
  if (!d.count()) return;
  const Rgb m{{mean[0], mean[1], mean[2]}}, sd{{std[0], std[1], std[2]}};
  dispatch_float(d.dtype, "images_u8_to_act", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(images_kernel<T>, grid_for(d.count()), kThreads, 0, s)(src, d, static_cast<T*>(dst), m, sd);
  });
  RD_LAUNCH_CHECK("images_u8_to_act");
}

void mix_images(const ActDesc& d, const void* src, void* dst, const math::ImageMix& mix, cudaStream_t s) {
  if (!d.count()) return;
  // torch multiplies by float casts of lambda and of (1 - lambda) taken in double.
  const float partner_w = static_cast<float>(1.0 - static_cast<double>(mix.lambda));
  dispatch_float(d.dtype, "mix_images", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(mix_images_kernel<T>, grid_for(d.count()), kThreads, 0, s)(static_cast<const T*>(src), d,
                                                                        static_cast<T*>(dst), mix, partner_w);
  });
  RD_LAUNCH_CHECK("mix_images");
}

void erase_rectangles(const ActDesc& d, void* x, const int32_t* boxes, cudaStream_t s) {
  if (!d.count()) return;
  dispatch_float(d.dtype, "erase_rectangles", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(erase_kernel<T>, grid_for(d.count()), kThreads, 0, s)(d, static_cast<T*>(x), boxes);
  });
  RD_LAUNCH_CHECK("erase_rectangles");
}

void stage_conv_weight(const float* w, int64_t o, int64_t i, int64_t kh, int64_t kw, bool ohwi,
                       DType t, void* dst, cudaStream_t s) {
  const int64_t n = o * i * kh * kw;
  if (!n) return;
  dispatch_float(t, "stage_conv_weight", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(stage_weight_kernel<T>, grid_for(n), kThreads, 0, s)(w, o, i, kh, kw, ohwi, static_cast<T*>(dst));
  });
  RD_LAUNCH_CHECK("stage_conv_weight");
}

void unstage_conv_weight_grad(const void* src, int64_t o, int64_t i, int64_t kh, int64_t kw,
                              bool ohwi, DType t, float* dw, bool accumulate, cudaStream_t s) {
  const int64_t n = o * i * kh * kw;
  if (!n) return;
  dispatch_float(t, "unstage_conv_weight_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    RD_LAUNCH(unstage_weight_grad_kernel<T>, grid_for(n), kThreads, 0, s)(static_cast<const T*>(src), o, i,
                                                                    kh, kw, ohwi, dw, accumulate);
  });
  RD_LAUNCH_CHECK("unstage_conv_weight_grad");
}

}  // namespace rd::kern
