// Index arithmetic for the plain activation layouts the CPU backend uses.
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

// Flat offset of logical element (n, c, h, w).
struct Indexer {
  Dims d;
  bool nhwc;
  explicit Indexer(const Tensor& t) : d(dims_of(t)), nhwc(t.layout == Layout::NHWC) {
    RD_CHECK(t.layout == Layout::NHWC || t.layout == Layout::NCHW,
             "CPU backend: unsupported layout " << layout_name(t.layout));
  }
  int64_t operator()(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return nhwc ? ((n * d.h + h) * d.w + w) * d.c + c : ((n * d.c + c) * d.h + h) * d.w + w;
  }
};

}  // namespace rd::cpu
