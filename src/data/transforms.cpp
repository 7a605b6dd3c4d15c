#include "resnet_ddp/data/transforms.h"

#include <algorithm>
#include <cstring>

#include "resnet_ddp/errors.h"

namespace rd::data {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t index)
    : state_(splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)) ^
                        static_cast<uint64_t>(index))) {}

uint64_t SampleRng::next_u64() {
  state_ += 0x9E3779B97F4A7C15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double SampleRng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

int64_t SampleRng::below(int64_t bound) {
  RD_CHECK(bound > 0, "SampleRng::below(" << bound << ")");
  // Lemire's multiply-shift: unbiased enough for bounds far below 2^64.
  return static_cast<int64_t>((static_cast<unsigned __int128>(next_u64()) * static_cast<uint64_t>(bound)) >> 64);
}

const float kImagenetMean[3] = {0.485f, 0.456f, 0.406f};
const float kImagenetStd[3] = {0.229f, 0.224f, 0.225f};

namespace {
void check_side(int value, const char* flag) {
  if (value < 8 || value > 4096) throw UsageError(std::string(flag) + " " + std::to_string(value) + ": expected 8..4096");
}
void check_probability(double p, const char* flag) {
  if (!(p >= 0.0 && p <= 1.0)) throw UsageError(std::string(flag) + " " + std::to_string(p) + ": expected 0..1");
}
}  // namespace

TransformPipeline::TransformPipeline(const TransformConfig& cfg, bool train) : cfg_(cfg), train_(train) {
  check_side(cfg.image_size, "--image-size");
  if (cfg.train_preset()) check_side(cfg.train_crop_size, "--train-crop-size");
  if (cfg.eval_preset()) {
    check_side(cfg.val_crop_size, "--val-crop-size");
    check_side(cfg.val_resize_size, "--val-resize-size");
  }
  check_probability(cfg.hflip_prob, "--hflip-prob");
  check_probability(cfg.random_erase, "--random-erase");
  if (cfg.ra_magnitude < 0 || cfg.ra_magnitude >= kAugmentBins)
    throw UsageError("--ra-magnitude " + std::to_string(cfg.ra_magnitude) + ": expected 0.." +
                     std::to_string(kAugmentBins - 1) + " (a bin of RandAugment's " + std::to_string(kAugmentBins) +
                     ")");
}

int TransformPipeline::output_size() const {
  if (train_) return cfg_.train_preset() ? cfg_.train_crop_size : cfg_.image_size;
  return cfg_.eval_preset() ? cfg_.val_crop_size : cfg_.image_size;
}

void TransformPipeline::apply_train_preset(Image& img, SampleRng& rng, uint8_t* out,
                                           TransformScratch& scratch) const {
  const int n = cfg_.train_crop_size;
  Image& work = scratch.work;
  work.resize(n, n);
  resized_crop(img, random_resized_crop_box(img.width, img.height, rng), n, work.data(), scratch.tmp);
  // RandomHorizontalFlip is in the preset only for p > 0 (then it always draws).
  if (cfg_.hflip_prob > 0.0 && rng.uniform() < cfg_.hflip_prob) hflip(work);
  switch (cfg_.auto_augment) {
    case TransformConfig::Policy::None: break;
    case TransformConfig::Policy::ImageNet: auto_augment(work, rng, scratch.tmp, cfg_.interpolation); break;
    case TransformConfig::Policy::TrivialAugmentWide:
      trivial_augment_wide(work, rng, scratch.tmp, cfg_.interpolation);
      break;
    case TransformConfig::Policy::RandAugment:
      rand_augment(work, rng, cfg_.ra_magnitude, scratch.tmp, cfg_.interpolation);
      break;
  }
  std::memcpy(out, work.data(), work.bytes());
}

void TransformPipeline::apply(Image& img, uint64_t seed, int64_t epoch, int64_t index, uint8_t* out,
                              TransformScratch& scratch, CropBox* erase) const {
  if (erase) *erase = CropBox{};
  if (!train_) {
    if (!cfg_.eval_preset()) return resize_bilinear_into(img, cfg_.image_size, cfg_.image_size, out);
    int w = 0, h = 0;
    shorter_side_size(img.width, img.height, cfg_.val_resize_size, w, h);
    resize_bilinear(img, w, h, scratch.work);
    return center_crop(scratch.work, cfg_.val_crop_size, out);
  }
  SampleRng rng(seed, epoch, index);
  if (cfg_.train_preset()) {
    apply_train_preset(img, rng, out, scratch);
  } else {
    switch (cfg_.augment) {
      case TransformConfig::Augment::AutoAugment: auto_augment(img, rng, scratch.tmp); break;
      case TransformConfig::Augment::Flip:
        if (rng.uniform() < 0.5) hflip(img);
        break;
      case TransformConfig::Augment::None: break;
    }
    resize_bilinear_into(img, cfg_.image_size, cfg_.image_size, out);
  }
  // Drawn after the image's own decisions, as RandomErasing comes last in the preset.
  if (cfg_.random_erase > 0.0 && erase)
    *erase = random_erasing_box(output_size(), output_size(), cfg_.random_erase, rng);
}

}  // namespace rd::data
