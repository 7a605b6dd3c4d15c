// The geometry of torchvision's reference presets (references/classification/presets.py)
// on PIL images: RandomResizedCrop, RandomHorizontalFlip, Resize(shorter side) +
// CenterCrop, and RandomErasing's rectangle. The random draws follow torchvision's
// order and float32 arithmetic; the pixels follow PIL's (crop is a copy, Resize is
// resize_bilinear).
#include "resnet_ddp/exact_fp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"

namespace rd::data {

namespace {

// torch.empty(1).uniform_(from, to).item(): a float32 in [from, to) from 24 random bits.
double torch_uniform_f32(SampleRng& rng, float from, float to) {
  const float x = static_cast<float>(rng.next_u64() >> 40) * 0x1.0p-24f;
  return static_cast<double>(x * (to - from) + from);
}

// Python's int(round(v)) for v >= 0: round half to even.
int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }

// One attempt's (area, aspect ratio) as torchvision draws them: area * U(scale),
// exp(U(log(ratio))) with the log-ratio bounds and exp in float32.
void draw_area_ratio(SampleRng& rng, double area, float scale_lo, float scale_hi, float ratio_lo, float ratio_hi,
                     double& target_area, double& aspect) {
  target_area = area * torch_uniform_f32(rng, scale_lo, scale_hi);
  const double log_ratio = torch_uniform_f32(rng, std::log(ratio_lo), std::log(ratio_hi));
  aspect = static_cast<double>(std::exp(static_cast<float>(log_ratio)));
}

}  // namespace

CropBox random_resized_crop_box(int width, int height, SampleRng& rng) {
  RD_CHECK(width > 0 && height > 0, "random_resized_crop_box: " << width << "x" << height);
  const float ratio_lo = 3.0f / 4.0f, ratio_hi = 4.0f / 3.0f;
  const double area = static_cast<double>(height) * width;
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target_area = 0, aspect = 0;
    draw_area_ratio(rng, area, 0.08f, 1.0f, ratio_lo, ratio_hi, target_area, aspect);
    const int w = py_round(std::sqrt(target_area * aspect));
    const int h = py_round(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      CropBox b;
      b.height = h;
      b.width = w;
      b.top = static_cast<int>(rng.below(height - h + 1));
      b.left = static_cast<int>(rng.below(width - w + 1));
      return b;
    }
  }
  // Central crop with the ratio clamped to [3/4, 4/3] (torchvision compares with the
  // Python floats 3/4 and 4/3, in double).
  const double in_ratio = static_cast<double>(width) / height;
  CropBox b{0, 0, height, width};
  if (in_ratio < 3.0 / 4.0) {
    b.height = py_round(width / (3.0 / 4.0));
  } else if (in_ratio > 4.0 / 3.0) {
    b.width = py_round(height * (4.0 / 3.0));
  }
  b.top = (height - b.height) / 2;
  b.left = (width - b.width) / 2;
  return b;
}

void resized_crop(const Image& src, const CropBox& box, int size, uint8_t* out, Image& tmp) {
  RD_CHECK(box.top >= 0 && box.left >= 0 && box.height > 0 && box.width > 0 && box.top + box.height <= src.height &&
               box.left + box.width <= src.width,
           "resized_crop: box outside the " << src.width << "x" << src.height << " image");
  tmp.resize(box.width, box.height);
  const size_t row = static_cast<size_t>(box.width) * 3;
  for (int y = 0; y < box.height; ++y)
    std::memcpy(tmp.data() + y * row,
                src.data() + (static_cast<size_t>(box.top + y) * src.width + box.left) * 3, row);
  resize_bilinear_into(tmp, size, size, out);
}

void shorter_side_size(int width, int height, int r, int& out_width, int& out_height) {
  RD_CHECK(width > 0 && height > 0 && r > 0, "shorter_side_size: " << width << "x" << height << " -> " << r);
  const int shorter = std::min(width, height), longer = std::max(width, height);
  // Python's int(r * long / short): the product is an int, the division true division.
  const int new_long = static_cast<int>(static_cast<double>(static_cast<int64_t>(r) * longer) / shorter);
  out_width = width <= height ? r : new_long;
  out_height = width <= height ? new_long : r;
}

void center_crop(const Image& src, int size, uint8_t* out) {
  RD_CHECK(src.width > 0 && src.height > 0 && size > 0, "center_crop: bad sizes");
  // torchvision pads (zeros) the sides smaller than the crop first, left/top getting
  // the smaller half, then crops the padded image at int(round((side - C) / 2.0)).
  auto origin = [size](int side) {
    const int pad_before = size > side ? (size - side) / 2 : 0;
    const int padded = size > side ? size : side;
    return static_cast<int>(std::nearbyint((padded - size) / 2.0)) - pad_before;
  };
  const int y0 = origin(src.height), x0 = origin(src.width);
  std::memset(out, 0, static_cast<size_t>(size) * size * 3);
  const int xa = std::max(0, -x0), xb = std::min(size, src.width - x0);  // columns inside the image
  for (int y = 0; y < size; ++y) {
    const int sy = y0 + y;
    if (sy < 0 || sy >= src.height || xb <= xa) continue;
    std::memcpy(out + (static_cast<size_t>(y) * size + xa) * 3,
                src.data() + (static_cast<size_t>(sy) * src.width + x0 + xa) * 3, static_cast<size_t>(xb - xa) * 3);
  }
}

void hflip(Image& img) {
  const size_t w = static_cast<size_t>(img.width);
  for (int y = 0; y < img.height; ++y) {
    uint8_t* row = img.data() + static_cast<size_t>(y) * w * 3;
    for (size_t a = 0, b = w - 1; a < b; ++a, --b)
      for (int c = 0; c < 3; ++c) std::swap(row[a * 3 + c], row[b * 3 + c]);
  }
}

CropBox random_erasing_box(int width, int height, double p, SampleRng& rng) {
  CropBox none{0, 0, 0, 0};
  if (!(torch_uniform_f32(rng, 0.0f, 1.0f) < p)) return none;  // torch.rand(1) < p
  const double area = static_cast<double>(height) * width;
  for (int attempt = 0; attempt < 10; ++attempt) {
    double erase_area = 0, aspect = 0;
    draw_area_ratio(rng, area, 0.02f, 0.33f, 0.3f, 3.3f, erase_area, aspect);
    // Unlike RandomResizedCrop: h from area * ratio, strict bounds, no h > 0 check.
    const int h = py_round(std::sqrt(erase_area * aspect));
    const int w = py_round(std::sqrt(erase_area / aspect));
    if (!(h < height && w < width)) continue;
    CropBox b;
    b.height = h;
    b.width = w;
    b.top = static_cast<int>(rng.below(height - h + 1));
    b.left = static_cast<int>(rng.below(width - w + 1));
    return b;
  }
  return none;
}

}  // namespace rd::data
