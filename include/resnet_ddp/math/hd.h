// RD_HD marks per-element math that both the CPU backend and CUDA kernels use,
// so the CPU tests cover the exact formulas the GPU runs.
#pragma once
#if defined(__CUDACC__)
#define RD_HD __host__ __device__ __forceinline__
#else
#define RD_HD inline
#endif
