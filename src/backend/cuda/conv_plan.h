// What the CUDA backend's files share about convolutions: the plan of one shape (cuDNN
// descriptors and the searched algorithms per direction; conv.cpp makes and runs plans,
// the backend's destructor frees them) and the small formatting helpers both use.
#pragma once

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "resnet_ddp/errors.h"

namespace rd::cuda {

enum ConvDir : int { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };

struct CudaBackend::ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  // Per direction (ConvDir): searched once. `choices` fastest first (cudnnFind's
  // order); the first one whose workspace can be allocated runs, the others are
  // the out-of-memory fallbacks. `nchw_f32`: cuDNN has no algorithm for this shape
  // in the activation type and layout; it runs through f32_nchw_plan instead.
  struct Dir {
    bool searched = false, nchw_f32 = false;
    std::vector<ConvChoice> choices;
  };
  Dir dir[3];
  int64_t yh = 0, yw = 0;
  ConvKey key{};
  DType dtype = DType::F32;
  int64_t x_count = 0, y_count = 0, w_count = 0;  // elements of each operand

  ~ConvPlan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

inline std::string mib(size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

inline int narrow(int64_t v, const char* what) {
  RD_CHECK(v >= 0 && v <= 2147483647LL, what << " " << v << " does not fit cuDNN's int");
  return static_cast<int>(v);
}

inline std::string dims(const kern::ActDesc& a) {
  std::ostringstream os;
  os << "[" << a.n << ", " << a.c << ", " << a.h << ", " << a.w << "]";
  return os.str();
}

}  // namespace rd::cuda
