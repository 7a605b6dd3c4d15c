// Softmax cross-entropy with label smoothing, PyTorch semantics:
//   q_k = (1 - s) [k == y] + s / K,   loss_i = -sum_k q_k log softmax(z_i)_k
// and the batch loss is the mean over rows. The gradient of the mean loss w.r.t.
// the logits is (softmax(z_i) - q) / N. One row at a time so a GPU thread block
// (or a CPU loop iteration) owns a row.
#pragma once
#include <math.h>

#include "resnet_ddp/math/hd.h"

namespace rd::math {

// The row's loss for smoothed targets q(k); writes d(loss_row)/d(z) * grad_scale into dz
// (may be null) and the row's argmax (the first maximum, torch.argmax's rule) into
// *argmax (may be null). Accumulates in double for stability: K is small (classes), so
// this costs nothing.
template <class SmoothedTarget>
RD_HD float softmax_xent_row_with(const float* z, int K, SmoothedTarget q_of, float grad_scale, float* dz,
                                  int* argmax) {
  float zmax = z[0];
  int amax = 0;
  for (int k = 1; k < K; ++k)
    if (z[k] > zmax) { zmax = z[k]; amax = k; }
  double sum = 0.0;
  for (int k = 0; k < K; ++k) sum += exp(static_cast<double>(z[k] - zmax));
  const double log_sum = log(sum);
  double loss = 0.0;
  for (int k = 0; k < K; ++k) {
    const double logp = static_cast<double>(z[k] - zmax) - log_sum;
    const double q = q_of(k);
    loss -= q * logp;
    if (dz) dz[k] = static_cast<float>((exp(logp) - q) * grad_scale);
  }
  if (argmax) *argmax = amax;
  return static_cast<float>(loss);
}

// One label: q_k = (1 - s) [k == y] + s / K.
RD_HD float softmax_xent_row(const float* z, int K, int label, float smoothing,
                             float grad_scale, float* dz, int* argmax) {
  const double off = static_cast<double>(smoothing) / K;
  const double on = 1.0 - static_cast<double>(smoothing) + off;
  return softmax_xent_row_with(z, K, [=](int k) { return k == label ? on : off; }, grad_scale, dz, argmax);
}

// Mixed (MixUp / CutMix) targets: t = lam onehot(a) + (1 - lam) onehot(b), smoothed as
// torch smooths probability targets, q = t (1 - s) + s / K. With a == b the two weights
// add to one, as torch's sum of the two one-hot halves does.
RD_HD float softmax_xent_mixed_row(const float* z, int K, int label, int partner, float lam, float smoothing,
                                   float grad_scale, float* dz, int* argmax) {
  const double keep = 1.0 - static_cast<double>(smoothing), off = static_cast<double>(smoothing) / K;
  const double w_label = static_cast<double>(lam), w_partner = 1.0 - static_cast<double>(lam);
  return softmax_xent_row_with(
      z, K,
      [=](int k) { return ((k == label ? w_label : 0.0) + (k == partner ? w_partner : 0.0)) * keep + off; },
      grad_scale, dz, argmax);
}

}  // namespace rd::math
