// Device-side helpers shared by kernels/*.cu: element load/store for the float
// dtypes, layout index math, launch geometry and the launch check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.cuh"
#include "resnet_ddp/errors.h"

namespace rd::kern {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Offset of logical element (n, c, h, w) in its layout.
__host__ __device__ __forceinline__ int64_t act_offset(const ActDesc& d, int64_t n, int64_t c,
                                                       int64_t h, int64_t w) {
  return d.nhwc ? ((n * d.h + h) * d.w + w) * d.c + c : ((n * d.c + c) * d.h + h) * d.w + w;
}

// Logical coordinates of the element at `offset`, in index type I.
template <class I>
__device__ __forceinline__ void act_coords_as(const ActDesc& d, I offset, int64_t& n, int64_t& c, int64_t& h,
                                              int64_t& w) {
  const I C = static_cast<I>(d.c), H = static_cast<I>(d.h), W = static_cast<I>(d.w);
  if (d.nhwc) {
    c = offset % C;
    I r = offset / C;
    w = r % W;
    r /= W;
    h = r % H;
    n = r / H;
  } else {
    w = offset % W;
    I r = offset / W;
    h = r % H;
    r /= H;
    c = r % C;
    n = r / C;
  }
}

// 32-bit unsigned division and remainder cost a fraction of 64-bit ones, which
// would make these memory-bound kernels ALU-bound; every tensor
// below 2^32 elements (any realistic batch) takes the 32-bit path. The branch
// is uniform across a launch.
__device__ __forceinline__ bool fits_u32(const ActDesc& d) { return d.count() <= 0xffffffffLL; }

__device__ __forceinline__ void act_coords(const ActDesc& d, int64_t offset, int64_t& n, int64_t& c,
                                           int64_t& h, int64_t& w) {
  if (fits_u32(d))
    act_coords_as<uint32_t>(d, static_cast<uint32_t>(offset), n, c, h, w);
  else
    act_coords_as<int64_t>(d, offset, n, c, h, w);
}

__device__ __forceinline__ int64_t act_channel(const ActDesc& d, int64_t offset) {
  if (fits_u32(d)) {
    const uint32_t o = static_cast<uint32_t>(offset), C = static_cast<uint32_t>(d.c);
    return d.nhwc ? o % C : (o / static_cast<uint32_t>(d.h * d.w)) % C;
  }
  return d.nhwc ? offset % d.c : (offset / (d.h * d.w)) % d.c;
}

// Every launch goes through RD_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...):
// `kernel<<<...>>>` under nvcc; under the emulated device (tests/cuda_emu/device.h,
// which defines it first) an enqueue on the emulator's stream.
#ifndef RD_LAUNCH
#define RD_LAUNCH(kernel, grid, block, shared_bytes, stream) kernel<<<grid, block, shared_bytes, stream>>>
#endif

#define RD_GRID_STRIDE(i, count)                                                         \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;          \
       i < static_cast<int64_t>(count); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `count` elements: enough to fill any GPU
// (grid-stride loops cover the rest), never zero.
// The emulated device (tests) caps grids at 64 blocks: every thread then strides,
// the path large tensors take on a GPU, and a launch costs fibers per thread, not
// per element.
#ifdef RESNET_DDP_CUDA_EMU
inline constexpr int64_t kMaxGridBlocks = 64;
#else
inline constexpr int64_t kMaxGridBlocks = 65535L * 8;
#endif
inline unsigned grid_for(int64_t count, int threads = kThreads) {
  int64_t blocks = (count + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxGridBlocks) blocks = kMaxGridBlocks;
  return static_cast<unsigned>(blocks);
}

// Throws rd::Error naming the kernel when its launch failed.
void check_launch(const char* kernel, const char* file, int line);
#define RD_LAUNCH_CHECK(name) ::rd::kern::check_launch(name, __FILE__, __LINE__)

template <class T> struct TypeTag {
  using type = T;
};

// Calls body(TypeTag<T>{}) with T the element type of `t`.
template <class F> void dispatch_float(DType t, const char* what, F&& body) {
  switch (t) {
    case DType::F32: body(TypeTag<float>{}); return;
    case DType::F16: body(TypeTag<__half>{}); return;
    case DType::BF16: body(TypeTag<__nv_bfloat16>{}); return;
    default: RD_FAIL(what << ": unsupported element type " << dtype_name(t));
  }
}

}  // namespace rd::kern
