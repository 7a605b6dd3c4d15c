// Index arithmetic for the activation layouts the CPU backend uses: plain NHWC and
// NCHW, and oneDNN's blocked nChw16c = (n, c/16, h, w, c%16), which the backend only
// uses for channel counts that are a multiple of 16 (Backend::layout_for_channels).
// An nChw16c tensor is an NHWC tensor of n*C/16 "images" with 16 channels each,
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

constexpr int64_t kBlock = 16;  // nChw16c

inline bool is_blocked(const Tensor& t) {
  if (t.layout != Layout::NCHW16C) return false;
  RD_CHECK(t.shape.rank == 4 && t.shape[1] % kBlock == 0,
           "CPU backend: nChw16c activations need a multiple of 16 channels, got " << t.describe());
  return true;
}

// The NHWC view of an NHWC or nChw16c tensor (see the top of this file).
inline Dims rows_view(const Tensor& t) {
  const Dims d = dims_of(t);
  return is_blocked(t) ? Dims{d.n * (d.c / kBlock), kBlock, d.h, d.w} : d;
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
    switch (layout) {
      case Layout::NHWC: return ((n * d.h + h) * d.w + w) * d.c + c;
      case Layout::NCHW16C: return (((n * (d.c / kBlock) + c / kBlock) * d.h + h) * d.w + w) * kBlock + c % kBlock;
      default: return ((n * d.c + c) * d.h + h) * d.w + w;
    }
  }
};

}  // namespace rd::cpu
