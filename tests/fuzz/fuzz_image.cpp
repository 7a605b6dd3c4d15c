// Fuzz target: image bytes through the loader's own decoder entry point
// (decode_image_memory: format sniffing, the dimension and decompression-bomb
// limits, 16-bit / gray / alpha conversion to RGB). Any rd::Error is a clean
// refusal; anything else (a sanitizer report, another exception) is a finding.
#include <cstddef>
#include <cstdint>

#include "data/internal.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A lower pixel limit than the loader's default (64 Mpx) keeps each run fast;
  // the guard's code path is the same.
  constexpr int64_t kMaxPixels = 1 << 20;
  rd::data::Image img;
  try {
    rd::data::decode_image_memory(data, size, "fuzz", img, kMaxPixels);
    if (img.bytes() != static_cast<size_t>(img.width) * img.height * 3) __builtin_trap();
  } catch (const rd::Error&) {
  }
  return 0;
}
