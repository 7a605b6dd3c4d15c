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

TransformPipeline::TransformPipeline(const TransformConfig& cfg, bool train) : cfg_(cfg), train_(train) {
  if (cfg.image_size < 8 || cfg.image_size > 4096)
    throw UsageError("--image-size " + std::to_string(cfg.image_size) + ": expected 8..4096");
}

namespace {
void hflip(Image& img) {
  const size_t w = static_cast<size_t>(img.width);
  for (int y = 0; y < img.height; ++y) {
    uint8_t* row = img.data() + static_cast<size_t>(y) * w * 3;
    for (size_t a = 0, b = w - 1; a < b; ++a, --b)
      for (int c = 0; c < 3; ++c) std::swap(row[a * 3 + c], row[b * 3 + c]);
  }
}
}  // namespace

void TransformPipeline::apply(Image& img, uint64_t seed, int64_t epoch, int64_t index,
                              uint8_t* out, TransformScratch& scratch) const {
  if (train_) {
    SampleRng rng(seed, epoch, index);
    switch (cfg_.augment) {
      case TransformConfig::Augment::AutoAugment: auto_augment(img, rng, scratch.tmp); break;
      case TransformConfig::Augment::Flip:
        if (rng.uniform() < 0.5) hflip(img);
        break;
      case TransformConfig::Augment::None: break;
    }
  }
  resize_bilinear_into(img, cfg_.image_size, cfg_.image_size, out);
}

}  // namespace rd::data
