// Optimizer updates for one parameter element, PyTorch semantics
// (torch.optim.Adam / torch.optim.SGD with L2 weight decay added to the gradient).
#pragma once
#include <math.h>
#include <stdint.h>

#include "resnet_ddp/math/hd.h"

namespace rd::math {

// One element of torchvision's ema_avg, decay * averaged + (1 - decay) * current, with
// the rounding of torch's separate mul, mul and add (no fused multiply-add on a GPU).
RD_HD float ema_average(float averaged, float current, float decay, float one_minus_decay) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(decay, averaged), __fmul_rn(one_minus_decay, current));
#else
  return decay * averaged + one_minus_decay * current;
#endif
}

struct AdamHyper {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 - beta1^t
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

// One Adam step as the caller states it (torch.optim.Adam's defaults); the
// backends derive the per-step AdamHyper from it with adam_hyper().
struct AdamArgs {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;  // 1-based count of steps taken, this one included
};

inline AdamHyper adam_hyper(const AdamArgs& a) {
  AdamHyper h{};
  h.lr = a.lr, h.beta1 = a.beta1, h.beta2 = a.beta2, h.eps = a.eps, h.weight_decay = a.weight_decay;
  const double t = static_cast<double>(a.step);
  h.bias_correction1 = static_cast<float>(1.0 - pow(static_cast<double>(a.beta1), t));
  h.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(a.beta2), t)));
  return h;
}

RD_HD void adam_update(float& p, float g, float& m, float& v, const AdamHyper& h) {
  if (h.weight_decay != 0.f) g += h.weight_decay * p;
  m = h.beta1 * m + (1.f - h.beta1) * g;
  v = h.beta2 * v + (1.f - h.beta2) * g * g;
  const float denom = sqrtf(v) / h.bias_correction2_sqrt + h.eps;
  p -= (h.lr / h.bias_correction1) * (m / denom);
}

struct SgdHyper {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first_step;  // PyTorch initialises the momentum buffer to the first gradient
};

RD_HD void sgd_update(float& p, float g, float& buf, const SgdHyper& h) {
  if (h.weight_decay != 0.f) g += h.weight_decay * p;
  if (h.momentum != 0.f) {
    buf = h.first_step ? g : h.momentum * buf + (1.f - h.dampening) * g;
    g = h.nesterov ? g + h.momentum * buf : buf;
  }
  p -= h.lr * g;
}

}  // namespace rd::math
