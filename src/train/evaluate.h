// Inference over a loader, shared by validation, --eval-only and `predict`: one way to
// put a decoded batch on the device and one loop that runs the model over batches.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "resnet_ddp/data/loader.h"
#include "resnet_ddp/nn/resnet.h"

namespace rd::train {

// --normalize: per-channel mean and std, or none (the pixel scaled to [0, 1]).
struct Normalization {
  const float* mean = nullptr;
  const float* std = nullptr;
};
Normalization normalization(const std::string& name);

// `batch`'s images in the model's input buffer, converted and normalised by the model's
// backend. The copy is not waited for: the backend orders the forward behind it.
Tensor& upload_batch(ResNet& model, const data::Batch& batch, const Normalization& norm);

// Predictions equal to their labels, of the first `n`.
int64_t count_correct(const int32_t* predictions, const int32_t* labels, int n);

// The model in evaluation mode over every batch `loader` yields (the caller restarts
// it), `each` seeing a batch and its logits.
void evaluate(ResNet& model, data::Loader& loader, const Normalization& norm,
              const std::function<void(const data::Batch&, const Tensor& logits)>& each);

// This rank's summed loss and counts.
struct ScoreSums {
  double loss = 0;
  int64_t correct = 0, count = 0;
};
// evaluate() scoring each batch against its labels (label-smoothed cross-entropy).
ScoreSums score(ResNet& model, data::Loader& loader, const Normalization& norm, float label_smoothing);

}  // namespace rd::train
