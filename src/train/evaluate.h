// Inference over a loader, shared by validation, --eval-only and `predict`: one way to
// put a decoded batch on the device and one loop that runs the model over batches.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

// Top-k accuracy (torchvision's Acc@5 with k = 5). One row of `classes` logits ranks
// class a above class b when its logit is larger, NaN above every number (torch.topk
// sorts NaN largest), and equal logits by class index, lower first: the first-maximum
// rule of top-1 (torch.argmax), which makes top-1 the k = 1 case. torch.topk leaves the
// order of ties unspecified, so only a tie across the k-th place can differ from it.
// k is capped at `classes` (torchvision's utils.accuracy would fail with fewer than 5
// classes; here every label is then in the top-k, 100%).
bool label_in_top_k(const float* logits, int classes, int label, int k);
// The row's k best classes in that order (fewer when classes < k).
std::vector<int> top_k_classes(const float* logits, int classes, int k);
// Rows of `n` (row-major n x classes logits) whose label is in their top k.
int64_t count_top_k(const float* logits, int classes, const int32_t* labels, int n, int k);
constexpr int kTopK = 5;  // the second accuracy validation reports (Acc@5)

// The model in evaluation mode over every batch `loader` yields (the caller restarts
// it), `each` seeing a batch and its logits.
void evaluate(ResNet& model, data::Loader& loader, const Normalization& norm,
              const std::function<void(const data::Batch&, const Tensor& logits)>& each);

// This rank's summed loss and counts (correct: top-1, correct_top5: label among the
// kTopK best logits).
struct ScoreSums {
  double loss = 0;
  int64_t correct = 0, count = 0;
  int64_t correct_top5 = 0;
};
// evaluate() scoring each batch against its labels (label-smoothed cross-entropy).
ScoreSums score(ResNet& model, data::Loader& loader, const Normalization& norm, float label_smoothing);

}  // namespace rd::train
