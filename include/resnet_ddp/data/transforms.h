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
};
constexpr int kAugOpCount = 14;
const char* aug_op_name(AugOp op);  // torchvision's spelling: "ShearX", "AutoContrast", ...

// Applies one op with an already-signed magnitude in torchvision's units:
// Shear: shear factor (degrees = atan(m)); Translate: pixels; Rotate: degrees
// (counter-clockwise); Brightness/Color/Contrast/Sharpness: 1 + m enhancement
// factor offset (m in [-0.9, 0.9]); Posterize: bits kept; Solarize: threshold.
// `scratch` avoids allocation in steady state; `img` is updated in place.
void apply_aug_op(AugOp op, float magnitude, Image& img, Image& scratch);

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
void auto_augment(Image& img, SampleRng& rng, Image& scratch);

// ---- pipeline ----------------------------------------------------------------
struct TransformConfig {
  int image_size = 244;
  // Spelled autoaugment | flip | none on the command line (train/option_types.h).
  enum class Augment : uint8_t { AutoAugment, Flip, None } augment = Augment::AutoAugment;
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

// train: augment (AutoAugment | horizontal flip p=0.5 | nothing) -> Resize((S, S));
// val:   Resize((S, S)). Writes S*S*3 bytes to `out`. When the input already has the
// target size, Resize is the identity (as in PIL).
class TransformPipeline {
 public:
  TransformPipeline(const TransformConfig& cfg, bool train);
  int output_size() const { return cfg_.image_size; }
  bool train() const { return train_; }
  const TransformConfig& config() const { return cfg_; }
  // `img` is consumed (may be modified); randomness from (seed, epoch, index).
  void apply(Image& img, uint64_t seed, int64_t epoch, int64_t index, uint8_t* out,
             TransformScratch& scratch) const;

 private:
  TransformConfig cfg_;
  bool train_;
};

}  // namespace rd::data
