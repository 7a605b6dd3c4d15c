// Optimizer updates for one parameter element, PyTorch semantics
// (torch.optim.Adam / torch.optim.SGD with L2 weight decay added to the gradient).
#pragma once
#include <math.h>

#include "resnet_ddp/math/hd.h"

namespace rd::math {

struct AdamHyper {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 - beta1^t
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

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
