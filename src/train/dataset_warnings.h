// Datasets that load fine but would give a meaningless or degraded run: said at start
// by training and by `train --check`, so they are seen before the hours are spent.
#pragma once

#include <string>
#include <vector>

#include "resnet_ddp/data/dataset.h"

namespace rd::train {

// One line each (without "warning: "): a single class (accuracy trivially 1.0), packed
// images smaller than --image-size (upsampled: blur, no detail).
std::vector<std::string> dataset_warnings(const data::Dataset& ds, int image_size);

}  // namespace rd::train
