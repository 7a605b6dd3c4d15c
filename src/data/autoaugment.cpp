// AutoAugment (ImageNet policy) on uint8 RGB with the semantics torchvision's
// AutoAugment has on PIL images: the enhance ops are PIL's ImageEnhance blends,
// the LUT ops are PIL's ImageOps, and the geometric ops are PIL's affine
// transform with nearest-neighbour sampling (16.16 fixed point) and fill 0.
#include "resnet_ddp/exact_fp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"

namespace rd::data {

namespace {

constexpr double kPi = 3.14159265358979323846;

// ---- per-channel lookup tables (ImageOps) ---------------------------------------
void apply_luts(Image& img, const uint8_t lut[3][256]) {
  uint8_t* p = img.data();
  const size_t n = static_cast<size_t>(img.width) * img.height;
  for (size_t i = 0; i < n; ++i, p += 3) {
    p[0] = lut[0][p[0]];
    p[1] = lut[1][p[1]];
    p[2] = lut[2][p[2]];
  }
}

void histograms(const Image& img, uint32_t h[3][256]) {
  std::memset(h, 0, sizeof(uint32_t) * 3 * 256);
  const uint8_t* p = img.data();
  const size_t n = static_cast<size_t>(img.width) * img.height;
  for (size_t i = 0; i < n; ++i, p += 3) {
    ++h[0][p[0]];
    ++h[1][p[1]];
    ++h[2][p[2]];
  }
}

void autocontrast(Image& img) {
  uint32_t h[3][256];
  histograms(img, h);
  uint8_t lut[3][256];
  for (int c = 0; c < 3; ++c) {
    int lo = 0, hi = 255;
    while (lo < 256 && !h[c][lo]) ++lo;
    while (hi >= 0 && !h[c][hi]) --hi;
    if (hi <= lo) {
      for (int i = 0; i < 256; ++i) lut[c][i] = static_cast<uint8_t>(i);
      continue;
    }
    const double scale = 255.0 / (hi - lo);
    const double offset = -lo * scale;
    for (int i = 0; i < 256; ++i) {
      int v = static_cast<int>(i * scale + offset);  // truncation, as Python's int()
      lut[c][i] = static_cast<uint8_t>(std::clamp(v, 0, 255));
    }
  }
  apply_luts(img, lut);
}

void equalize(Image& img) {
  uint32_t h[3][256];
  histograms(img, h);
  uint8_t lut[3][256];
  for (int c = 0; c < 3; ++c) {
    int nonzero = 0;
    uint64_t total = 0, last_nonzero = 0;
    for (int i = 0; i < 256; ++i)
      if (h[c][i]) {
        ++nonzero;
        total += h[c][i];
        last_nonzero = h[c][i];
      }
    const uint64_t step = nonzero <= 1 ? 0 : (total - last_nonzero) / 255;
    if (!step) {
      for (int i = 0; i < 256; ++i) lut[c][i] = static_cast<uint8_t>(i);
      continue;
    }
    uint64_t n = step / 2;
    for (int i = 0; i < 256; ++i) {
      lut[c][i] = static_cast<uint8_t>(std::min<uint64_t>(n / step, 255));
      n += h[c][i];
    }
  }
  apply_luts(img, lut);
}

void simple_lut(Image& img, int op, float magnitude) {
  uint8_t lut[3][256];
  for (int i = 0; i < 256; ++i) {
    uint8_t v = static_cast<uint8_t>(i);
    if (op == 0) {  // posterize: keep the top `bits` bits
      const int bits = static_cast<int>(magnitude);
      v = static_cast<uint8_t>(i & ~((1 << (8 - bits)) - 1));
    } else if (op == 1) {  // solarize: invert values at or above the threshold
      v = static_cast<float>(i) < magnitude ? static_cast<uint8_t>(i) : static_cast<uint8_t>(255 - i);
    } else {  // invert
      v = static_cast<uint8_t>(255 - i);
    }
    lut[0][i] = lut[1][i] = lut[2][i] = v;
  }
  apply_luts(img, lut);
}

// ---- ImageEnhance: blend(degenerate, image, factor) -------------------------------
// PIL's ImagingBlend takes alpha as float: interpolation truncates the float result,
// extrapolation clips it.
inline uint8_t blend_px(int degenerate, int image, float alpha, bool interpolate) {
  const float t = static_cast<float>(degenerate) + alpha * static_cast<float>(image - degenerate);
  if (interpolate) return static_cast<uint8_t>(t);
  if (t <= 0.0f) return 0;
  if (t >= 255.0f) return 255;
  return static_cast<uint8_t>(t);
}

void blend_with(Image& img, const uint8_t* degenerate, double alpha_in) {
  const float alpha = static_cast<float>(alpha_in);
  const bool interpolate = alpha >= 0.0 && alpha <= 1.0;
  uint8_t* p = img.data();
  for (size_t i = 0; i < img.bytes(); ++i) p[i] = blend_px(degenerate[i], p[i], alpha, interpolate);
}

void blend_with_constant(Image& img, int degenerate, double alpha_in) {
  const float alpha = static_cast<float>(alpha_in);
  const bool interpolate = alpha >= 0.0 && alpha <= 1.0;
  uint8_t lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = blend_px(degenerate, v, alpha, interpolate);
  uint8_t* p = img.data();
  for (size_t i = 0; i < img.bytes(); ++i) p[i] = lut[p[i]];
}

// PIL's RGB -> L conversion (ITU-R 601-2 luma, 16-bit fixed point with rounding).
inline uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

void color(Image& img, double factor, Image& scratch) {
  scratch.resize(img.width, img.height);
  const uint8_t* p = img.data();
  uint8_t* g = scratch.data();
  const size_t n = static_cast<size_t>(img.width) * img.height;
  for (size_t i = 0; i < n; ++i) g[3 * i] = g[3 * i + 1] = g[3 * i + 2] = luma(p + 3 * i);
  blend_with(img, scratch.data(), factor);
}

void contrast(Image& img, double factor) {
  uint64_t hist[256] = {};
  const uint8_t* p = img.data();
  const size_t n = static_cast<size_t>(img.width) * img.height;
  for (size_t i = 0; i < n; ++i) ++hist[luma(p + 3 * i)];
  uint64_t sum = 0;
  for (int i = 0; i < 256; ++i) sum += static_cast<uint64_t>(i) * hist[i];
  const int mean = static_cast<int>(static_cast<double>(sum) / static_cast<double>(n) + 0.5);
  blend_with_constant(img, mean, factor);
}

// PIL's ImageFilter.SMOOTH (3x3 kernel 1 1 1 / 1 5 1 / 1 1 1, scale 13) in float,
// border pixels copied unchanged, then blended with the original.
void sharpness(Image& img, double factor, Image& scratch) {
  const int w = img.width, h = img.height;
  scratch.resize(w, h);
  std::memcpy(scratch.data(), img.data(), img.bytes());
  if (w >= 3 && h >= 3) {
    const float k_side = 1.0f / 13.0f, k_center = 5.0f / 13.0f;
    const size_t stride = static_cast<size_t>(w) * 3;
    for (int y = 1; y < h - 1; ++y) {
      const uint8_t* above = img.data() + (y - 1) * stride;
      const uint8_t* row = img.data() + y * stride;
      const uint8_t* below = img.data() + (y + 1) * stride;
      uint8_t* out = scratch.data() + y * stride;
      for (int x = 1; x < w - 1; ++x)
        for (int c = 0; c < 3; ++c) {
          const size_t i = static_cast<size_t>(x) * 3 + c;
          // Same float operation order as PIL's KERNEL1x3 sums (below, centre, above).
          float s = 0.5f;
          s += static_cast<float>(below[i - 3]) * k_side + static_cast<float>(below[i]) * k_side +
               static_cast<float>(below[i + 3]) * k_side;
          s += static_cast<float>(row[i - 3]) * k_side + static_cast<float>(row[i]) * k_center +
               static_cast<float>(row[i + 3]) * k_side;
          s += static_cast<float>(above[i - 3]) * k_side + static_cast<float>(above[i]) * k_side +
               static_cast<float>(above[i + 3]) * k_side;
          out[i] = s <= 0.0f ? 0 : (s >= 255.0f ? 255 : static_cast<uint8_t>(s));
        }
    }
  }
  blend_with(img, scratch.data(), factor);
}

// ---- geometry: PIL Image.transform(AFFINE, NEAREST) with fill 0 --------------------
// `a` maps output pixel (x, y) to the input: (a0 x + a1 y + a2, a3 x + a4 y + a5).
inline int pil_coord(double v) { return v < 0.0 ? -1 : static_cast<int>(v); }
inline int pil_floor(double v) { return v < 0.0 ? static_cast<int>(std::floor(v)) : static_cast<int>(v); }

bool fits_fixed(const double a[6], int x, int y) {
  return std::fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 &&
         std::fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

void affine_nearest(Image& img, const double a[6], Image& scratch) {
  const int w = img.width, h = img.height;
  scratch.resize(w, h);
  std::memset(scratch.data(), 0, scratch.bytes());
  const uint8_t* in = img.data();
  uint8_t* out = scratch.data();
  auto put = [&](int x, int y, int xin, int yin) {
    std::memcpy(out + (static_cast<size_t>(y) * w + x) * 3, in + (static_cast<size_t>(yin) * w + xin) * 3, 3);
  };
  if (a[1] == 0 && a[3] == 0) {  // pure scale/translate (PIL's ImagingScaleAffine)
    for (int y = 0; y < h; ++y) {
      const int yin = pil_coord(a[4] * (y + 0.5) + a[5]);
      if (yin < 0 || yin >= h) continue;
      for (int x = 0; x < w; ++x) {
        const int xin = pil_coord(a[0] * (x + 0.5) + a[2]);
        if (xin >= 0 && xin < w) put(x, y, xin, yin);
      }
    }
  } else if (fits_fixed(a, 0, 0) && fits_fixed(a, w, h) && fits_fixed(a, 0, h) && fits_fixed(a, w, 0)) {
    // 16.16 fixed point stepping, as PIL's affine_fixed.
    auto fix = [](double v) { return pil_floor(v * 65536.0 + 0.5); };
    const int a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
    int a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5);
    int a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
    for (int y = 0; y < h; ++y) {
      int xx = a2, yy = a5;
      for (int x = 0; x < w; ++x) {
        const int xin = xx >> 16;
        if (xin >= 0 && xin < w) {
          const int yin = yy >> 16;
          if (yin >= 0 && yin < h) put(x, y, xin, yin);
        }
        xx += a0;
        yy += a3;
      }
      a2 += a1;
      a5 += a4;
    }
  } else {  // very large images: same mapping in floating point
    double xo = a[2] + a[1] * 0.5 + a[0] * 0.5;
    double yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    for (int y = 0; y < h; ++y) {
      double xx = xo, yy = yo;
      for (int x = 0; x < w; ++x) {
        const int xin = pil_coord(xx);
        if (xin >= 0 && xin < w) {
          const int yin = pil_coord(yy);
          if (yin >= 0 && yin < h) put(x, y, xin, yin);
        }
        xx += a[0];
        yy += a[3];
      }
      xo += a[1];
      yo += a[4];
    }
  }
  std::swap(img.pixels, scratch.pixels);
}

// PIL's Image.transform(AFFINE, BILINEAR) with fill 0 (Geometry.c: the generic
// transform with bilinear_filter32RGB): the input point of output pixel centre
// (x + .5, y + .5), outside [0, w) x [0, h) -> 0; otherwise a 2x2 blend in double
// with edge-clamped neighbours, truncated to uint8.
void affine_bilinear(Image& img, const double a[6], Image& scratch) {
  const int w = img.width, h = img.height;
  scratch.resize(w, h);
  const uint8_t* in = img.data();
  uint8_t* out = scratch.data();
  const size_t stride = static_cast<size_t>(w) * 3;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x, out += 3) {
      const double xs = x + 0.5, ys = y + 0.5;
      double xin = a[0] * xs + a[1] * ys + a[2];
      double yin = a[3] * xs + a[4] * ys + a[5];
      if (xin < 0.0 || xin >= w || yin < 0.0 || yin >= h) {
        out[0] = out[1] = out[2] = 0;
        continue;
      }
      xin -= 0.5;
      yin -= 0.5;
      const int x0 = pil_floor(xin), y0 = pil_floor(yin);
      const double dx = xin - x0, dy = yin - y0;
      const size_t c0 = static_cast<size_t>(std::clamp(x0, 0, w - 1)) * 3;
      const size_t c1 = static_cast<size_t>(std::clamp(x0 + 1, 0, w - 1)) * 3;
      const uint8_t* r0 = in + static_cast<size_t>(std::clamp(y0, 0, h - 1)) * stride;
      const bool has_r1 = y0 + 1 >= 0 && y0 + 1 < h;
      const uint8_t* r1 = has_r1 ? in + static_cast<size_t>(y0 + 1) * stride : r0;
      for (int c = 0; c < 3; ++c) {
        const double v1 = r0[c0 + c] + (r0[c1 + c] - r0[c0 + c]) * dx;
        const double v2 = has_r1 ? r1[c0 + c] + (r1[c1 + c] - r1[c0 + c]) * dx : v1;
        out[c] = static_cast<uint8_t>(v1 + (v2 - v1) * dy);
      }
    }
  std::swap(img.pixels, scratch.pixels);
}

void affine(Image& img, const double a[6], Image& scratch, Interpolation interpolation) {
  if (interpolation == Interpolation::Bilinear)
    affine_bilinear(img, a, scratch);
  else
    affine_nearest(img, a, scratch);
}

// PIL's Image.transpose(ROTATE_90 / ROTATE_180 / ROTATE_270) for `quarter_turns`
// counter-clockwise turns (90 and 270 on square images only, as PIL's rotate uses them).
void rotate_quarters(Image& img, int quarter_turns, Image& scratch) {
  const int w = img.width, h = img.height;
  scratch.resize(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      int sx = x, sy = y;
      if (quarter_turns == 2) {
        sx = w - 1 - x;
        sy = h - 1 - y;
      } else if (quarter_turns == 1) {  // counter-clockwise: out(x, y) = in(w-1-y, x)
        sx = w - 1 - y;
        sy = x;
      } else {
        sx = y;
        sy = h - 1 - x;
      }
      std::memcpy(scratch.data() + (static_cast<size_t>(y) * w + x) * 3,
                  img.data() + (static_cast<size_t>(sy) * w + sx) * 3, 3);
    }
  std::swap(img.pixels, scratch.pixels);
}

// torchvision's _get_inverse_affine_matrix (angle 0, scale 1) for shear/translate.
void inverse_affine(double cx, double cy, double tx, double ty, double shear_x_deg,
                    double shear_y_deg, double m[6]) {
  const double rot = 0.0;
  const double sx = shear_x_deg * (kPi / 180.0);
  const double sy = shear_y_deg * (kPi / 180.0);
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  m[0] = d; m[1] = -b; m[2] = 0.0; m[3] = -c; m[4] = a; m[5] = 0.0;
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
}

// Python's round(x, 15) (PIL rounds the rotation matrix this way): the exact binary
// value rounded to 15 decimals, then read back correctly rounded; glibc's printf and
// strtod are exact like Python's dtoa (x * 1e15 would round first and differ by an ulp).
double round15(double x) {
  char text[64];
  std::snprintf(text, sizeof text, "%.15f", x);
  return std::strtod(text, nullptr);
}

void rotate(Image& img, double degrees, Image& scratch, Interpolation interpolation) {
  double angle = std::fmod(degrees, 360.0);  // Python's %: the result takes the divisor's sign
  if (angle < 0) angle += 360.0;
  if (angle == 0.0) return;
  // PIL's rotate transposes instead for these (exact, no resampling).
  if (angle == 180.0) return rotate_quarters(img, 2, scratch);
  if ((angle == 90.0 || angle == 270.0) && img.width == img.height)
    return rotate_quarters(img, angle == 90.0 ? 1 : 3, scratch);
  const double cx = img.width / 2.0, cy = img.height / 2.0;
  const double r = -angle * (kPi / 180.0);
  double m[6] = {round15(std::cos(r)), round15(std::sin(r)), 0.0,
                 round15(-std::sin(r)), round15(std::cos(r)), 0.0};
  const double t2 = m[0] * -cx + m[1] * -cy + m[2];
  const double t5 = m[3] * -cx + m[4] * -cy + m[5];
  m[2] = t2 + cx;
  m[5] = t5 + cy;
  affine(img, m, scratch, interpolation);
}

}  // namespace

const char* aug_op_name(AugOp op) {
  static const char* const names[kAugOpCount] = {
      "ShearX",     "ShearY",   "TranslateX", "TranslateY", "Rotate",
      "Brightness", "Color",    "Contrast",   "Sharpness",  "Posterize",
      "Solarize",   "AutoContrast", "Equalize", "Invert", "Identity"};
  return names[static_cast<int>(op)];
}

void apply_aug_op(AugOp op, float magnitude, Image& img, Image& scratch, Interpolation interpolation) {
  const double m = magnitude;
  double mat[6];
  switch (op) {
    case AugOp::ShearX:
    case AugOp::ShearY: {
      // torchvision converts the shear factor to degrees (atan) and back (tan).
      const double deg = std::atan(m) * (180.0 / kPi);
      inverse_affine(0, 0, 0, 0, op == AugOp::ShearX ? deg : 0.0, op == AugOp::ShearY ? deg : 0.0, mat);
      affine(img, mat, scratch, interpolation);
      return;
    }
    case AugOp::TranslateX:
    case AugOp::TranslateY: {
      const double t = static_cast<double>(static_cast<int>(m));  // torchvision: int(magnitude)
      inverse_affine(img.width * 0.5, img.height * 0.5, op == AugOp::TranslateX ? t : 0.0,
                     op == AugOp::TranslateY ? t : 0.0, 0.0, 0.0, mat);
      affine(img, mat, scratch, interpolation);
      return;
    }
    case AugOp::Rotate: rotate(img, m, scratch, interpolation); return;
    case AugOp::Brightness: blend_with_constant(img, 0, 1.0 + m); return;
    case AugOp::Color: color(img, 1.0 + m, scratch); return;
    case AugOp::Contrast: contrast(img, 1.0 + m); return;
    case AugOp::Sharpness: sharpness(img, 1.0 + m, scratch); return;
    case AugOp::Posterize: simple_lut(img, 0, magnitude); return;
    case AugOp::Solarize: simple_lut(img, 1, magnitude); return;
    case AugOp::AutoContrast: autocontrast(img); return;
    case AugOp::Equalize: equalize(img); return;
    case AugOp::Invert: simple_lut(img, 2, magnitude); return;
    case AugOp::Identity: return;
  }
}

const std::array<std::array<AugStep, 2>, 25>& imagenet_policy() {
  using O = AugOp;
  static const std::array<std::array<AugStep, 2>, 25> policy = {{
      {{{O::Posterize, 0.4f, 8}, {O::Rotate, 0.6f, 9}}},
      {{{O::Solarize, 0.6f, 5}, {O::AutoContrast, 0.6f, -1}}},
      {{{O::Equalize, 0.8f, -1}, {O::Equalize, 0.6f, -1}}},
      {{{O::Posterize, 0.6f, 7}, {O::Posterize, 0.6f, 6}}},
      {{{O::Equalize, 0.4f, -1}, {O::Solarize, 0.2f, 4}}},
      {{{O::Equalize, 0.4f, -1}, {O::Rotate, 0.8f, 8}}},
      {{{O::Solarize, 0.6f, 3}, {O::Equalize, 0.6f, -1}}},
      {{{O::Posterize, 0.8f, 5}, {O::Equalize, 1.0f, -1}}},
      {{{O::Rotate, 0.2f, 3}, {O::Solarize, 0.6f, 8}}},
      {{{O::Equalize, 0.6f, -1}, {O::Posterize, 0.4f, 6}}},
      {{{O::Rotate, 0.8f, 8}, {O::Color, 0.4f, 0}}},
      {{{O::Rotate, 0.4f, 9}, {O::Equalize, 0.6f, -1}}},
      {{{O::Equalize, 0.0f, -1}, {O::Equalize, 0.8f, -1}}},
      {{{O::Invert, 0.6f, -1}, {O::Equalize, 1.0f, -1}}},
      {{{O::Color, 0.6f, 4}, {O::Contrast, 1.0f, 8}}},
      {{{O::Rotate, 0.8f, 8}, {O::Color, 1.0f, 2}}},
      {{{O::Color, 0.8f, 8}, {O::Solarize, 0.8f, 7}}},
      {{{O::Sharpness, 0.4f, 7}, {O::Invert, 0.6f, -1}}},
      {{{O::ShearX, 0.6f, 5}, {O::Equalize, 1.0f, -1}}},
      {{{O::Color, 0.4f, 0}, {O::Equalize, 0.6f, -1}}},
      {{{O::Equalize, 0.4f, -1}, {O::Solarize, 0.2f, 4}}},
      {{{O::Solarize, 0.6f, 5}, {O::AutoContrast, 0.6f, -1}}},
      {{{O::Invert, 0.6f, -1}, {O::Equalize, 1.0f, -1}}},
      {{{O::Color, 0.6f, 4}, {O::Contrast, 1.0f, 8}}},
      {{{O::Equalize, 0.8f, -1}, {O::Equalize, 0.6f, -1}}},
  }};
  return policy;
}

// torch 1.13's CPU kernel (built for AVX2 with FMA, torch's default capability): one
// element at a time, the first half start + step * i and the second end - step * (n-1-i),
// each contracted into one FMA by the compiler; but for steps >= 16 the leading blocks of
// 16 take its vectorised path (2 x Vectorized<float> of 8 lanes), where each 8-lane
// chunk is base + k * step without FMA from its first element's serial value. The results
// differ in the last bit, so all of it is reproduced (checked against torch for every
// table in tests/data/check_vs_torchvision.py).
float torch_linspace(float start, float end, int steps, int i) {
  if (steps == 1) return start;
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int halfway = steps / 2;
  auto serial = [&](int idx) {
    return idx < halfway ? std::fma(step, static_cast<float>(idx), start)
                         : std::fma(-step, static_cast<float>(steps - idx - 1), end);
  };
  constexpr int kLanes = 8;
  const int vectorised_end = steps / (2 * kLanes) * (2 * kLanes);
  if (i >= vectorised_end) return serial(i);
  const int chunk = i - i % kLanes;
  return serial(chunk) + static_cast<float>(i - chunk) * step;
}

bool aug_op_signed(AugOp op) {
  switch (op) {
    case AugOp::Posterize: case AugOp::Solarize: case AugOp::AutoContrast:
    case AugOp::Equalize: case AugOp::Invert: case AugOp::Identity: return false;
    default: return true;
  }
}

namespace {
float linspace10(float start, float end, int i) { return torch_linspace(start, end, 10, i); }
}  // namespace

float aug_magnitude(AugOp op, int bin, int width, int height) {
  if (bin < 0) return 0.0f;
  switch (op) {
    case AugOp::ShearX: case AugOp::ShearY: return linspace10(0.0f, 0.3f, bin);
    case AugOp::TranslateX:
      return linspace10(0.0f, static_cast<float>(150.0 / 331.0 * width), bin);
    case AugOp::TranslateY:
      return linspace10(0.0f, static_cast<float>(150.0 / 331.0 * height), bin);
    case AugOp::Rotate: return linspace10(0.0f, 30.0f, bin);
    case AugOp::Brightness: case AugOp::Color: case AugOp::Contrast: case AugOp::Sharpness:
      return linspace10(0.0f, 0.9f, bin);
    case AugOp::Posterize:  // 8 - round(bin / 2.25)
      return static_cast<float>(8 - static_cast<int>(std::nearbyint(static_cast<float>(bin) / 2.25f)));
    case AugOp::Solarize: return linspace10(255.0f, 0.0f, bin);
    default: return 0.0f;
  }
}

void auto_augment(Image& img, SampleRng& rng, Image& scratch, Interpolation interpolation) {
  const auto& policy = imagenet_policy();
  // Same draws as torchvision's get_params: sub-policy, two probabilities, two signs.
  const auto& sub = policy[static_cast<size_t>(rng.below(static_cast<int64_t>(policy.size())))];
  const double probs[2] = {rng.uniform(), rng.uniform()};
  const bool positive[2] = {rng.below(2) == 1, rng.below(2) == 1};
  for (int i = 0; i < 2; ++i) {
    const AugStep& s = sub[static_cast<size_t>(i)];
    if (probs[i] > s.probability) continue;
    float m = aug_magnitude(s.op, s.magnitude_bin, img.width, img.height);
    if (aug_op_signed(s.op) && !positive[i]) m = -m;
    apply_aug_op(s.op, m, img, scratch, interpolation);
  }
}

}  // namespace rd::data
