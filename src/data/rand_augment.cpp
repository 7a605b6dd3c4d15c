// RandAugment and TrivialAugmentWide with torchvision's op space, magnitude tables
// and order of random draws; the ops themselves are AutoAugment's (autoaugment.cpp),
// which reproduce PIL's.
#include "resnet_ddp/exact_fp.h"

#include <array>
#include <cmath>

#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"

namespace rd::data {

AugOp wide_space_op(int index) {
  using O = AugOp;
  static constexpr std::array<AugOp, kWideSpaceOps> space = {
      O::Identity, O::ShearX,     O::ShearY, O::TranslateX, O::TranslateY, O::Rotate,       O::Brightness,
      O::Color,    O::Contrast,   O::Sharpness, O::Posterize, O::Solarize, O::AutoContrast, O::Equalize};
  RD_CHECK(index >= 0 && index < kWideSpaceOps, "wide_space_op(" << index << ")");
  return space[static_cast<size_t>(index)];
}

namespace {

bool has_magnitudes(AugOp op) {
  return op != AugOp::Identity && op != AugOp::AutoContrast && op != AugOp::Equalize && op != AugOp::Invert;
}

// 8 - (torch.arange(31) / divisor).round().int(): float32 division, round half to even.
float posterize_bits(int bin, float divisor) {
  return static_cast<float>(8 - static_cast<int>(std::nearbyint(static_cast<float>(bin) / divisor)));
}

float linspace31(float start, float end, int bin) { return torch_linspace(start, end, kAugmentBins, bin); }

}  // namespace

float trivial_wide_magnitude(AugOp op, int bin) {
  if (bin < 0 || !has_magnitudes(op)) return 0.0f;
  RD_CHECK(bin < kAugmentBins, "trivial_wide_magnitude: bin " << bin);
  switch (op) {
    case AugOp::ShearX: case AugOp::ShearY: return linspace31(0.0f, 0.99f, bin);
    case AugOp::TranslateX: case AugOp::TranslateY: return linspace31(0.0f, 32.0f, bin);
    case AugOp::Rotate: return linspace31(0.0f, 135.0f, bin);
    case AugOp::Brightness: case AugOp::Color: case AugOp::Contrast: case AugOp::Sharpness:
      return linspace31(0.0f, 0.99f, bin);
    case AugOp::Posterize: return posterize_bits(bin, (kAugmentBins - 1) / 6.0f);
    case AugOp::Solarize: return linspace31(255.0f, 0.0f, bin);
    default: return 0.0f;
  }
}

float rand_augment_magnitude(AugOp op, int bin, int width, int height) {
  if (bin < 0 || !has_magnitudes(op)) return 0.0f;
  RD_CHECK(bin < kAugmentBins, "rand_augment_magnitude: bin " << bin);
  switch (op) {
    case AugOp::ShearX: case AugOp::ShearY: return linspace31(0.0f, 0.3f, bin);
    case AugOp::TranslateX: return linspace31(0.0f, static_cast<float>(150.0 / 331.0 * width), bin);
    case AugOp::TranslateY: return linspace31(0.0f, static_cast<float>(150.0 / 331.0 * height), bin);
    case AugOp::Rotate: return linspace31(0.0f, 30.0f, bin);
    case AugOp::Brightness: case AugOp::Color: case AugOp::Contrast: case AugOp::Sharpness:
      return linspace31(0.0f, 0.9f, bin);
    case AugOp::Posterize: return posterize_bits(bin, (kAugmentBins - 1) / 4.0f);
    case AugOp::Solarize: return linspace31(255.0f, 0.0f, bin);
    default: return 0.0f;
  }
}

AugChoice draw_trivial_augment(SampleRng& rng) {
  AugChoice c;
  c.op = wide_space_op(static_cast<int>(rng.below(kWideSpaceOps)));
  if (has_magnitudes(c.op)) c.bin = static_cast<int>(rng.below(kAugmentBins));
  if (aug_op_signed(c.op)) c.negative = rng.below(2) == 1;
  return c;
}

AugChoice draw_rand_augment_op(SampleRng& rng, int magnitude) {
  AugChoice c;
  c.op = wide_space_op(static_cast<int>(rng.below(kWideSpaceOps)));
  c.bin = has_magnitudes(c.op) ? magnitude : -1;
  if (aug_op_signed(c.op)) c.negative = rng.below(2) == 1;
  return c;
}

void trivial_augment_wide(Image& img, SampleRng& rng, Image& scratch, Interpolation interpolation) {
  const AugChoice c = draw_trivial_augment(rng);
  const float m = trivial_wide_magnitude(c.op, c.bin);
  apply_aug_op(c.op, c.negative ? -m : m, img, scratch, interpolation);
}

void rand_augment(Image& img, SampleRng& rng, int magnitude, Image& scratch, Interpolation interpolation) {
  RD_CHECK(magnitude >= 0 && magnitude < kAugmentBins, "rand_augment: magnitude " << magnitude);
  for (int i = 0; i < kRandAugmentNumOps; ++i) {
    const AugChoice c = draw_rand_augment_op(rng, magnitude);
    // Translate's range depends on the image size, which the ops keep.
    const float m = rand_augment_magnitude(c.op, c.bin, img.width, img.height);
    apply_aug_op(c.op, c.negative ? -m : m, img, scratch, interpolation);
  }
}

}  // namespace rd::data
