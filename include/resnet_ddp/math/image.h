// Image input conversion shared by the CPU loader path and the CUDA kernel:
// torchvision's ToTensor (uint8 / 255) followed by Normalize ((v - mean) / std), and
// the batch mixing (MixUp / CutMix) the CPU and CUDA backends share.
#pragma once
#include <stdint.h>

#include "resnet_ddp/math/hd.h"

namespace rd::math {

// mean = 0, std = 1 gives plain ToTensor.
RD_HD float image_u8_to_input(uint8_t v, float mean, float std) {
  return (static_cast<float>(v) / 255.f - mean) / std;
}

// MixUp / CutMix of an image batch with the batch rolled by one (torchvision's
// RandomMixup / RandomCutmix pair image i with image i-1, image 0 with N-1).
// MixUp: dst_i = src_i * lambda + src_{i-1} * (1 - lambda), each product rounded
// to float as torch's in-place mul_/add_ do. CutMix: dst_i = src_i except the box
// rows [y0, y1) x columns [x0, x1), which come from src_{i-1}.
struct ImageMix {
  bool cutmix = false;
  float lambda = 1.f;          // MixUp's weight of the image itself
  int64_t x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // CutMix's box (empty when x0 == x1 or y0 == y1)
};

// MixUp of one element in torch's order (RandomMixup: batch.mul_(lam).add_(rolled.mul_(1 - lam))):
// both products rounded to float before the sum. The weights are the float casts
// torch's scalar multiply uses.
RD_HD float mixup_element(float self, float partner, float self_weight, float partner_weight) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(self, self_weight), __fmul_rn(partner, partner_weight));  // never fused
#else
  // volatile: each product is stored rounded, so the compiler cannot fuse either into an FMA.
  const volatile float a = self * self_weight;
  const volatile float b = partner * partner_weight;
  return a + b;
#endif
}

}  // namespace rd::math
