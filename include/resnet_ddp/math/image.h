// Image input conversion shared by the CPU loader path and the CUDA kernel:
// torchvision's ToTensor (uint8 / 255) followed by Normalize ((v - mean) / std).
#pragma once
#include <stdint.h>

#include "resnet_ddp/math/hd.h"

namespace rd::math {

// mean = 0, std = 1 gives plain ToTensor.
RD_HD float image_u8_to_input(uint8_t v, float mean, float std) {
  return (static_cast<float>(v) / 255.f - mean) / std;
}

}  // namespace rd::math
