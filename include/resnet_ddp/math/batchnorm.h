// Batch-norm per-element math shared by the CPU backend and the CUDA kernels
// (including SyncBatchNorm, whose statistics are summed across ranks first).
#pragma once
#include <math.h>

#include "resnet_ddp/math/hd.h"

namespace rd::math {

// From per-channel sums of (x - shift) and (x - shift)^2 over `count` elements
// to mean and biased variance. A shift near the mean (the GPU uses the running
// mean, the same on every rank) keeps E[d^2] - E[d]^2 from cancelling when
// |mean| >> std, and keeps float partial sums small: the shifted-data variance
// algorithm, as robust as Welford's for this use.
RD_HD void bn_stats_from_shifted_sums(double shift, double sum, double sumsq, double count, float& mean,
                                      float& var) {
  const double m = sum / count;
  double v = sumsq / count - m * m;
  mean = static_cast<float>(shift + m);
  var = static_cast<float>(v > 0.0 ? v : 0.0);
}

// From per-channel sums over `count` elements to mean and biased variance.
RD_HD void bn_stats_from_sums(double sum, double sumsq, double count, float& mean, float& var) {
  bn_stats_from_shifted_sums(0.0, sum, sumsq, count, mean, var);
}

// PyTorch running-stat update: momentum-weighted, running_var uses the unbiased
// variance (count / (count - 1)).
RD_HD void bn_update_running(float& running_mean, float& running_var, float mean, float var,
                             double count, float momentum) {
  const double unbiased = count > 1.0 ? var * count / (count - 1.0) : var;
  running_mean = (1.f - momentum) * running_mean + momentum * mean;
  running_var = static_cast<float>((1.0 - momentum) * running_var + momentum * unbiased);
}

RD_HD float bn_invstd(float var, float eps) { return 1.f / sqrtf(var + eps); }

// y = gamma * (x - mean) * invstd + beta, written as y = x * scale + shift.
RD_HD void bn_scale_shift(float gamma, float beta, float mean, float invstd, float& scale,
                          float& shift) {
  scale = gamma * invstd;
  shift = beta - mean * scale;
}

// dx for training-mode BN given the (global) channel sums
//   sum_dy = sum(dy), sum_dy_xhat = sum(dy * xhat) over `count` elements:
//   dx = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count)
RD_HD float bn_backward_dx(float dy, float x, float mean, float invstd, float gamma,
                           float mean_dy, float mean_dy_xhat) {
  const float xhat = (x - mean) * invstd;
  return gamma * invstd * (dy - mean_dy - xhat * mean_dy_xhat);
}

// The same dx as an affine function of (dy, x) per channel: dx = k*dy + p*x + q with
//   k = gamma*invstd, p = -k*invstd*mean_dy_xhat, q = k*(mean*invstd*mean_dy_xhat - mean_dy),
// so the element loop needs two FMAs and three per-channel values.
RD_HD void bn_backward_coefficients(float gamma, float mean, float invstd, double mean_dy,
                                    double mean_dy_xhat, float& k, float& p, float& q) {
  const double kd = static_cast<double>(gamma) * invstd;
  const double slope = static_cast<double>(invstd) * mean_dy_xhat;
  k = static_cast<float>(kd);
  p = static_cast<float>(-kd * slope);
  q = static_cast<float>(kd * (mean * slope - mean_dy));
}

RD_HD float bn_backward_dx_affine(float dy, float x, float k, float p, float q) {
  return k * dy + p * x + q;
}

}  // namespace rd::math
