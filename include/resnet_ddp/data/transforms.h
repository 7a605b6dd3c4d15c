// Image transforms on uint8 RGB (HWC), with the semantics torchvision applies to
// PIL images (the reference recipe runs ImageFolder -> AutoAugment -> Resize on PIL):
//  - resize_bilinear: PIL's Image.resize(BILINEAR), antialiased when shrinking
//    (separable triangle filter widened by the scale, fixed-point like PIL).
//  - AutoAugment ImageNet policy: 25 sub-policies of two ops each; the geometric
//    ops use nearest-neighbour affine sampling with fill 0 like PIL's transform.
// Per-sample randomness comes from SampleRng(seed, epoch, index) only, so results do
// not depend on which loader thread handled a sample.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "resnet_ddp/data/dataset.h"

namespace rd::data {

// Counter-based generator: the stream is a pure function of (seed, epoch, index).
class SampleRng {
 public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t index);
  uint64_t next_u64();
  double uniform();                 // [0, 1)
  int64_t below(int64_t bound);     // uniform integer in [0, bound)

 private:
  uint64_t state_;
};

// Resize to out_w x out_h with PIL's antialiased bilinear filter (dst is resized).
void resize_bilinear(const Image& src, int out_w, int out_h, Image& dst);
// Same, writing into caller memory of out_w * out_h * 3 bytes.
void resize_bilinear_into(const Image& src, int out_w, int out_h, uint8_t* dst);

// ---- AutoAugment ---------------------------------------------------------------
enum class AugOp : uint8_t {
  ShearX, ShearY, TranslateX, TranslateY, Rotate, Brightness, Color, Contrast, Sharpness,
  Posterize, Solarize, AutoContrast, Equalize, Invert,
  Identity,  // RandAugment / TrivialAugmentWide only: leaves the image unchanged
};
constexpr int kAugOpCount = 15;
const char* aug_op_name(AugOp op);  // torchvision's spelling: "ShearX", "AutoContrast", ...

// How the geometric ops (shear, translate, rotate) sample: PIL's NEAREST (torchvision's
// default, the tutorial's AutoAugment) or BILINEAR (the reference recipe passes
// --interpolation to its AutoAugment / RandAugment / TrivialAugmentWide).
enum class Interpolation : uint8_t { Nearest, Bilinear };

// Applies one op with an already-signed magnitude in torchvision's units:
// Shear: shear factor (degrees = atan(m)); Translate: pixels; Rotate: degrees
// (counter-clockwise); Brightness/Color/Contrast/Sharpness: 1 + m enhancement
// factor offset (m in [-0.9, 0.9]); Posterize: bits kept; Solarize: threshold.
// `scratch` avoids allocation in steady state; `img` is updated in place.
void apply_aug_op(AugOp op, float magnitude, Image& img, Image& scratch,
                  Interpolation interpolation = Interpolation::Nearest);

struct AugStep {
  AugOp op;
  float probability;
  int magnitude_bin;  // index into torchvision's 10-bin magnitude table; -1 when unused
};
// The 25 ImageNet sub-policies, in torchvision's order.
const std::array<std::array<AugStep, 2>, 25>& imagenet_policy();
// Signed magnitude of `op` at `bin` as torchvision computes it for num_bins = 10 and
// the given image size (translate depends on width/height).
float aug_magnitude(AugOp op, int bin, int width, int height);

// One random ImageNet sub-policy applied to `img` (torchvision's AutoAugment.forward).
void auto_augment(Image& img, SampleRng& rng, Image& scratch,
                  Interpolation interpolation = Interpolation::Nearest);

// torch.linspace(start, end, steps)[i] in float32, as torch's CPU kernel computes it.
float torch_linspace(float start, float end, int steps, int i);
// Whether torchvision draws a sign for `op` (its augmentation spaces' `signed`).
bool aug_op_signed(AugOp op);

// ---- RandAugment / TrivialAugmentWide (rand_augment.cpp) -------------------------
// Both draw from torchvision's 14-op space, in its order: Identity, ShearX, ShearY,
// TranslateX, TranslateY, Rotate, Brightness, Color, Contrast, Sharpness, Posterize,
// Solarize, AutoContrast, Equalize (no Invert).
constexpr int kWideSpaceOps = 14;
AugOp wide_space_op(int index);
constexpr int kAugmentBins = 31;       // num_magnitude_bins of both (torchvision's default)
constexpr int kRandAugmentNumOps = 2;  // RandAugment's num_ops (the reference recipe's)
// TrivialAugmentWide's magnitude of `op` at `bin` (0..30): its wide table (shear 0.99,
// translate 32 px, rotate 135 degrees, enhance 0.99, posterize 8..2, solarize 255..0).
float trivial_wide_magnitude(AugOp op, int bin);
// RandAugment's magnitude of `op` at `bin` (0..30) for a width x height image.
float rand_augment_magnitude(AugOp op, int bin, int width, int height);

// One random choice: the op, its magnitude bin (-1 for ops without magnitudes) and
// whether the magnitude is negated.
struct AugChoice {
  AugOp op = AugOp::Identity;
  int bin = -1;
  bool negative = false;
};
// Drawn in torchvision's order: op index, then (ops with magnitudes) the bin, then
// (signed ops) the sign.
AugChoice draw_trivial_augment(SampleRng& rng);
// One of RandAugment's num_ops draws: op index, then (signed ops) the sign.
AugChoice draw_rand_augment_op(SampleRng& rng, int magnitude);
// TrivialAugmentWide.forward / RandAugment(num_ops 2, `magnitude`, 31 bins).forward.
void trivial_augment_wide(Image& img, SampleRng& rng, Image& scratch, Interpolation interpolation);
void rand_augment(Image& img, SampleRng& rng, int magnitude, Image& scratch, Interpolation interpolation);

// ---- torchvision reference presets' geometry (presets.cpp) -------------------------
struct CropBox {  // four int32 in this order (the loader copies it as such)
  int32_t top = 0, left = 0, height = 0, width = 0;
};
// RandomResizedCrop.get_params(scale (0.08, 1), ratio (3/4, 4/3)) for a width x height
// image: 10 attempts (area uniform in scale, log-ratio uniform, w/h rounded, accepted
// when it fits, then top and left uniform), else the central crop clamped to the ratio.
CropBox random_resized_crop_box(int width, int height, SampleRng& rng);
// F.resized_crop on PIL: crop `box` (inside the image), then Resize((size, size)).
// Writes size*size*3 bytes to `out`; `tmp` holds the crop.
void resized_crop(const Image& src, const CropBox& box, int size, uint8_t* out, Image& tmp);
// F.resize(img, R) for an int R: the shorter side becomes R, the longer int(R * long / short).
void shorter_side_size(int width, int height, int r, int& out_width, int& out_height);
// F.center_crop(img, C): zero padding where the image is smaller, top/left =
// int(round((side - C) / 2.0)) (round half to even). Writes C*C*3 bytes to `out`.
void center_crop(const Image& src, int size, uint8_t* out);
// F.hflip.
void hflip(Image& img);
// RandomErasing(p, scale (0.02, 0.33), ratio (0.3, 3.3)).get_params on a width x height
// image after the coin torch.rand(1) < p: height 0 when the coin says no or all 10
// attempts fail (torchvision then returns the image unchanged).
CropBox random_erasing_box(int width, int height, double p, SampleRng& rng);


// ---- pipeline ----------------------------------------------------------------
struct TransformConfig {
  int image_size = 244;
  // Spelled autoaugment | flip | none on the command line (train/option_types.h).
  enum class Augment : uint8_t { AutoAugment, Flip, None } augment = Augment::AutoAugment;

  // torchvision's reference presets (ClassificationPresetTrain / Eval); zero sizes keep
  // the tutorial pipeline above.
  // train_crop_size > 0: training is RandomResizedCrop(N) -> RandomHorizontalFlip(hflip_prob)
  // -> auto_augment (with `interpolation`), instead of `augment` -> Resize((S, S)).
  int train_crop_size = 0;
  double hflip_prob = 0.5;
  // --auto-augment: imagenet is AutoAugment's ImageNet policy (what `augment` autoaugment
  // applies in the tutorial pipeline, there with NEAREST as torchvision's default).
  enum class Policy : uint8_t { None, ImageNet, TrivialAugmentWide, RandAugment } auto_augment = Policy::None;
  int ra_magnitude = 9;
  Interpolation interpolation = Interpolation::Bilinear;
  // val_crop_size > 0: evaluation is Resize(val_resize_size) (shorter side) -> CenterCrop(C).
  int val_resize_size = 0;
  int val_crop_size = 0;
  // RandomErasing(p) runs after Normalize, on the float tensor: the pipeline only draws
  // the rectangle (apply's `erase`); the backend zeroes it after normalising.
  double random_erase = 0.0;

  bool train_preset() const { return train_crop_size > 0; }
  bool eval_preset() const { return val_crop_size > 0; }
};

// torchvision's ImageNet Normalize constants, for --normalize imagenet (the backend
// applies them in images_u8_to_activation).
extern const float kImagenetMean[3];
extern const float kImagenetStd[3];

// Per-thread working memory of the pipeline.
struct TransformScratch {
  Image decoded;
  Image work;
  Image tmp;
};

// train, tutorial: augment (AutoAugment | horizontal flip p=0.5 | nothing) -> Resize((S, S));
// train, preset:   RandomResizedCrop(N) -> flip(p) -> policy (see TransformConfig);
// eval, tutorial:  Resize((S, S));   eval, preset: Resize(R) -> CenterCrop(C).
// Writes output_size()^2 * 3 bytes to `out`. When the input already has the target size,
// Resize is the identity (as in PIL). Every random decision of a sample comes, in
// torchvision's order, from one SampleRng(seed, epoch, index).
class TransformPipeline {
 public:
  TransformPipeline(const TransformConfig& cfg, bool train);
  int output_size() const;
  bool train() const { return train_; }
  const TransformConfig& config() const { return cfg_; }
  // `img` is consumed (may be modified). `erase` (may be null) receives training's
  // RandomErasing rectangle in output pixels (height 0: none).
  void apply(Image& img, uint64_t seed, int64_t epoch, int64_t index, uint8_t* out,
             TransformScratch& scratch, CropBox* erase = nullptr) const;

 private:
  void apply_train_preset(Image& img, SampleRng& rng, uint8_t* out, TransformScratch& scratch) const;
  TransformConfig cfg_;
  bool train_;
};

}  // namespace rd::data
