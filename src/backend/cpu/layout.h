// Index arithmetic for the activation layouts the CPU backend uses: plain NHWC and
// NCHW, and oneDNN's channel-blocked nChw16c / nChw8c = (n, c/B, h, w, c%B) with
// B = 16 (AVX-512 kernels) or 8 (AVX2 kernels), which the backend only uses for
// channel counts that are a multiple of B (Backend::layout_for_channels).
// A blocked tensor is an NHWC tensor of n*C/B "images" with B channels each,
// which is how the channel-independent ops (pooling) treat it.
#pragma once

#include <cstdint>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/tensor.h"

namespace rd::cpu {

struct Dims {
  int64_t n, c, h, w;
};

inline Dims dims_of(const Tensor& t) {
  RD_CHECK(t.shape.rank == 4, "expected a 4-D activation, got " << t.describe());
  return {t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
}

constexpr int64_t kMaxBlock = 16;  // the widest channel block (nChw16c)

inline bool is_blocked(const Tensor& t) {
  const int64_t b = channel_block(t.layout);
  if (b == 1) return false;
  RD_CHECK(t.shape.rank == 4 && t.shape[1] % b == 0,
           "CPU backend: " << layout_name(t.layout) << " activations need a multiple of " << b
                           << " channels, got " << t.describe());
  return true;
}

// The NHWC view of an NHWC or channel-blocked tensor (see the top of this file).
inline Dims rows_view(const Tensor& t) {
  const Dims d = dims_of(t);
  const int64_t b = channel_block(t.layout);
  return is_blocked(t) ? Dims{d.n * (d.c / b), b, d.h, d.w} : d;
}

// Flat offset of logical element (n, c, h, w).
struct Indexer {
  Dims d;
  Layout layout;
  explicit Indexer(const Tensor& t) : d(dims_of(t)), layout(t.layout) {
    RD_CHECK(t.layout == Layout::NHWC || t.layout == Layout::NCHW || is_blocked(t),
             "CPU backend: unsupported layout " << layout_name(t.layout));
  }
  int64_t operator()(int64_t n, int64_t c, int64_t h, int64_t w) const {
    const int64_t b = channel_block(layout);
    switch (layout) {
      case Layout::NHWC: return ((n * d.h + h) * d.w + w) * d.c + c;
      case Layout::NCHW16C:
      case Layout::NCHW8C: return (((n * (d.c / b) + c / b) * d.h + h) * d.w + w) * b + c % b;
      default: return ((n * d.c + c) * d.h + h) * d.w + w;
    }
  }
};

}  // namespace rd::cpu
