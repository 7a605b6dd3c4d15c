// Antialiased bilinear resize with the arithmetic of PIL's Image.resize(BILINEAR)
// (libImaging/Resample.c): a triangle filter whose support widens with the
// downscale factor, separable (horizontal pass, then vertical), coefficients
// normalised per output pixel and applied in 22-bit fixed point with rounding.
// Matching PIL's integer arithmetic makes the output bit-exact with torchvision's
// Resize on PIL images.
#include "resnet_ddp/exact_fp.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"

namespace rd::data {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;    // per output pixel: first input index, count
  std::vector<int32_t> kk;    // out_size * ksize fixed-point weights
  std::vector<double> tmp;
};

double triangle(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

void precompute(int in_size, int out_size, Coeffs& c) {
  const double in0 = 0.0, in1 = in_size;
  const double scale = (in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filterscale;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.assign(static_cast<size_t>(out_size) * 2, 0);
  c.tmp.assign(static_cast<size_t>(out_size) * c.ksize, 0.0);
  c.kk.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double* k = &c.tmp[static_cast<size_t>(xx) * c.ksize];
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = triangle((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x)
      if (ww != 0.0) k[x] /= ww;
    c.bounds[static_cast<size_t>(xx) * 2] = xmin;
    c.bounds[static_cast<size_t>(xx) * 2 + 1] = xmax;
  }
  for (size_t i = 0; i < c.tmp.size(); ++i) {
    const double v = c.tmp[i] * (1 << kPrecisionBits);
    c.kk[i] = static_cast<int32_t>(c.tmp[i] < 0 ? -0.5 + v : 0.5 + v);
  }
}

inline uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Rows [row0, row0 + rows) of src (width in_w) -> dst (width out_w, `rows` rows).
void horizontal(const uint8_t* src, int in_w, int row0, int rows, int out_w, const Coeffs& c,
                uint8_t* dst) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + (static_cast<size_t>(row0 + y) * in_w) * 3;
    uint8_t* out = dst + static_cast<size_t>(y) * out_w * 3;
    for (int xx = 0; xx < out_w; ++xx) {
      const int xmin = c.bounds[static_cast<size_t>(xx) * 2];
      const int xmax = c.bounds[static_cast<size_t>(xx) * 2 + 1];
      const int32_t* k = &c.kk[static_cast<size_t>(xx) * c.ksize];
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      const uint8_t* p = in + static_cast<size_t>(xmin) * 3;
      for (int x = 0; x < xmax; ++x, p += 3) {
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
      }
      out[xx * 3 + 0] = clip8(s0);
      out[xx * 3 + 1] = clip8(s1);
      out[xx * 3 + 2] = clip8(s2);
    }
  }
}

// src (width w, any rows) -> dst (width w, out_h rows); bounds index rows of src.
void vertical(const uint8_t* src, int w, int out_h, const Coeffs& c, int row_shift, uint8_t* dst) {
  const size_t stride = static_cast<size_t>(w) * 3;
  thread_local std::vector<int32_t> acc;
  acc.resize(stride);
  for (int yy = 0; yy < out_h; ++yy) {
    const int ymin = c.bounds[static_cast<size_t>(yy) * 2] - row_shift;
    const int ymax = c.bounds[static_cast<size_t>(yy) * 2 + 1];
    const int32_t* k = &c.kk[static_cast<size_t>(yy) * c.ksize];
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    // Row-wise accumulation: same sums as PIL's per-pixel loop (integer adds are exact),
    // but streams contiguous memory.
    for (int y = 0; y < ymax; ++y) {
      const uint8_t* in = src + static_cast<size_t>(ymin + y) * stride;
      const int32_t ky = k[y];
      for (size_t i = 0; i < stride; ++i) acc[i] += in[i] * ky;
    }
    uint8_t* out = dst + static_cast<size_t>(yy) * stride;
    for (size_t i = 0; i < stride; ++i) out[i] = clip8(acc[i]);
  }
}

}  // namespace

void resize_bilinear_into(const Image& src, int out_w, int out_h, uint8_t* dst) {
  RD_CHECK(src.width > 0 && src.height > 0 && out_w > 0 && out_h > 0,
           "resize: bad sizes " << src.width << "x" << src.height << " -> " << out_w << "x" << out_h);
  if (src.width == out_w && src.height == out_h) {
    std::memcpy(dst, src.data(), src.bytes());
    return;
  }
  thread_local Coeffs ch, cv;
  thread_local std::vector<uint8_t> temp;
  const bool need_h = out_w != src.width;
  const bool need_v = out_h != src.height;
  if (!need_h) {
    precompute(src.height, out_h, cv);
    vertical(src.data(), src.width, out_h, cv, 0, dst);
    return;
  }
  precompute(src.width, out_w, ch);
  if (!need_v) {
    horizontal(src.data(), src.width, 0, src.height, out_w, ch, dst);
    return;
  }
  precompute(src.height, out_h, cv);
  // Only the source rows the vertical pass reads go through the horizontal pass.
  const int first = cv.bounds[0];
  const int last = cv.bounds[static_cast<size_t>(out_h) * 2 - 2] + cv.bounds[static_cast<size_t>(out_h) * 2 - 1];
  temp.resize(static_cast<size_t>(last - first) * out_w * 3);
  horizontal(src.data(), src.width, first, last - first, out_w, ch, temp.data());
  vertical(temp.data(), out_w, out_h, cv, first, dst);
}

void resize_bilinear(const Image& src, int out_w, int out_h, Image& dst) {
  RD_CHECK(&src != &dst, "resize_bilinear: source and destination must differ");
  dst.resize(out_w, out_h);
  resize_bilinear_into(src, out_w, out_h, dst.data());
}

}  // namespace rd::data
