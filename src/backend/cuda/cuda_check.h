// Checks for every CUDA runtime / cuDNN / cuBLAS call: a failure throws
// rd::Error naming the call, the error and file:line.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>

namespace rd::cuda {

[[noreturn]] void fail_cuda(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void fail_cudnn(cudnnStatus_t s, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line);
// "asked 512.0 MiB, free 100.0 MiB of 80.0 GiB on device 0".
[[noreturn]] void fail_oom(size_t asked, const char* what, const char* file, int line);

}  // namespace rd::cuda

#define RD_CUDA(call)                                                            \
  do {                                                                           \
    const cudaError_t rd_e_ = (call);                                            \
    if (rd_e_ != cudaSuccess) ::rd::cuda::fail_cuda(rd_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define RD_CUDNN(call)                                                               \
  do {                                                                               \
    const cudnnStatus_t rd_s_ = (call);                                              \
    if (rd_s_ != CUDNN_STATUS_SUCCESS) ::rd::cuda::fail_cudnn(rd_s_, #call, __FILE__, __LINE__); \
  } while (0)

#define RD_CUBLAS(call)                                                                \
  do {                                                                                 \
    const cublasStatus_t rd_s_ = (call);                                               \
    if (rd_s_ != CUBLAS_STATUS_SUCCESS) ::rd::cuda::fail_cublas(rd_s_, #call, __FILE__, __LINE__); \
  } while (0)
