// MixUp / CutMix on the training batch, torchvision's reference recipe
// (references/classification/train.py --mixup-alpha / --cutmix-alpha, transforms.py
// RandomMixup / RandomCutmix, each with p = 1.0 behind a RandomChoice when both are on):
//  - lambda ~ Beta(alpha, alpha); the partner of sample i is sample i-1 of the same
//    per-rank batch (the batch rolled by one; sample 0's partner is the last), and each
//    DDP rank mixes its own batch, as torchvision's collate_fn does per process;
//  - CutMix's box: r_x, r_y uniform integers in [0, W), [0, H), r = 0.5 sqrt(1 - lambda),
//    half sizes int(r W), int(r H), clamped to the image, and lambda recomputed as
//    1 - box area / image area;
//  - the target is lambda onehot(own label) + (1 - lambda) onehot(partner's label).
// The draws are ours (not torch's generator stream, which lives in torchvision's
// DataLoader workers): a counter-based seed from (run seed, epoch, step in epoch,
// micro-batch, rank), so a resumed run draws exactly what the uninterrupted one did.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/math/image.h"

namespace rd::train {

struct MixingOptions {
  double mixup_alpha = 0.0;   // 0: off
  double cutmix_alpha = 0.0;  // 0: off
  bool enabled() const { return mixup_alpha > 0.0 || cutmix_alpha > 0.0; }
};

// Where a batch's draws come from.
struct MixingDrawKey {
  uint64_t seed = 0;
  int64_t epoch = 0, step = 0;  // step within the epoch (what a resume restarts at)
  int micro = 0, rank = 0;
};

struct BatchMixing {
  math::ImageMix image;   // what Backend::mix_images does
  float target_lambda = 1.f;  // weight of each sample's own label (CutMix: from the box)
};

// Beta(alpha, alpha) from two Gamma(alpha) draws in log space (Marsaglia-Tsang; for
// alpha < 1 boosted by U^(1/alpha)), so tiny alphas give 0 or 1, never NaN.
double sample_symmetric_beta(std::mt19937_64& gen, double alpha);

// The batch's choice (MixUp or CutMix, uniform when both are on), lambda and box for
// images of height x width. Requires o.enabled().
BatchMixing draw_batch_mixing(const MixingOptions& o, const MixingDrawKey& key, int64_t height, int64_t width);

// CutMix's box for a drawn lambda and centre (r_x, r_y), torchvision's arithmetic;
// sets image (cutmix, box) and target_lambda (1 - box area / image area).
BatchMixing cutmix_box(double lambda, int64_t r_x, int64_t r_y, int64_t height, int64_t width);

// Labels of the partners (the batch rolled by one): out[i] = labels[i - 1], out[0] = labels[n - 1].
std::vector<int32_t> partner_labels(const int32_t* labels, int n);

// The class training accuracy counts as right under mixing: torchvision's
// utils.accuracy takes the argmax of the mixed target, i.e. the own label when its
// weight (float, as torch's target) is larger, the partner's when smaller, and the
// lower class index on a tie (torch's max returns the first maximum).
int32_t mixed_target_class(int32_t label, int32_t partner, float lambda);

// Soft targets for the loss (TrainStep::forward_sums): sample i's target is
// lambda onehot(labels[i]) + (1 - lambda) onehot(partner_labels[i]).
struct MixedTargets {
  const int32_t* partner_labels = nullptr;
  float lambda = 1.f;
};

// What a training micro-batch feeds the forward: the input (mixed, or the batch's own),
// the class per sample that training accuracy counts as right, and the soft targets
// (null: the labels alone). Valid until the mixer's next mix().
struct MixedBatch {
  const Tensor* input = nullptr;
  const int32_t* accuracy_targets = nullptr;
  const MixedTargets* targets = nullptr;
};

// MixUp / CutMix for the epoch loop: one call per micro-batch hands back what the forward
// takes, so the loop is the same with mixing on or off. The mixed copy and the label
// buffers are kept between calls (a step allocates nothing once the shape is known).
class BatchMixer {
 public:
  BatchMixer() = default;
  // `seed`: the run's; `rank`: each rank mixes its own batch, as torchvision's collate_fn
  // does per process.
  BatchMixer(Backend& backend, const MixingOptions& options, uint64_t seed, int rank);
  bool enabled() const { return options_.enabled(); }
  // The run's line naming what is on ("Batch mixing: ..."); empty when off.
  std::string description() const;
  // Micro-batch `micro` of step `step` (within `epoch`): a resume at that step redraws
  // the same. `input` is the batch uploaded and normalised; `labels` its n labels.
  MixedBatch mix(const Tensor& input, const int32_t* labels, int n, int64_t epoch, int64_t step, int micro);

 private:
  Backend* backend_ = nullptr;
  MixingOptions options_;
  MixingDrawKey key_;
  Tensor mixed_input_;
  std::vector<int32_t> partner_labels_, target_classes_;
  MixedTargets targets_;
};

}  // namespace rd::train
