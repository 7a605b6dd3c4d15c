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

// ---- per-parameter-tensor ("segment") updates -------------------------------------------
// The updates whose scalars differ per parameter tensor: per-tensor weight decay
// (torchvision's --norm-weight-decay / --bias-weight-decay param groups) and the
// layer-wise trust ratios of timm's LARS / LAMB. A backend call covers the whole arena;
// each segment (one parameter's slice) brings its own `decay` and `scale`.
enum class SegmentRule : int32_t {
  Sgd,            // torch.optim.SGD: g += decay * p; momentum (s0, may be null)
  Adam,           // torch.optim.Adam: g += decay * p; s0 exp_avg, s1 exp_avg_sq
  AdamW,          // torch.optim.AdamW: p *= scale (= 1 - lr * decay), then Adam without decay
  RmsProp,        // torch.optim.RMSprop (not centred): s0 square_avg, s1 momentum_buffer (may be null)
  Lars,           // timm Lars: g = (g + decay * p) * scale (the trust ratio), then SGD
  LambMoments,    // timm Lamb, first pass: g /= grad_divisor; moments; g <- the update (+ decay * p)
  ScaledDescent,  // timm Lamb, second pass: p -= lr * (g * scale)
};

// The scalars torch computes in double (1 - beta, lr / bias_correction1) come precomputed:
// a float recomputation differs by an ulp every step, and that bias accumulates.
struct SegmentHyper {
  SegmentRule rule = SegmentRule::Sgd;
  float lr = 0.f, eps = 1e-8f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float one_minus_beta1 = 0.1f;                  // also LAMB's gradient weight (grad averaging)
  float one_minus_beta2 = 0.001f;
  float step_size = 0.f;                         // Adam: lr / (1 - beta1^t)
  float bias_correction1 = 1.f;                  // LAMB: 1 - beta1^t
  float bias_correction2_sqrt = 1.f;             // sqrt(1 - beta2^t)
  float alpha = 0.99f, one_minus_alpha = 0.01f;  // RMSprop's smoothing constant
  float momentum = 0.f, dampening = 0.f;         // SGD / LARS / RMSprop
  float grad_divisor = 1.f;                      // LAMB's global clip (timm divides the gradient)
  bool nesterov = false;
  bool first_step = false;                       // SGD / LARS seed the momentum buffer with g
};

// One element of segment `decay`/`scale`, the rule a template argument: a loop over a
// segment then holds one straight-line body that the CPU compiler vectorises (a switch per
// element kept it scalar, ~3.4 ns per parameter). s0/s1 are the element's state (unused
// ones: any float). g is read, and LambMoments writes the update back into it.
template <SegmentRule R>
RD_HD void segment_update_as(float& p, float& g, float& s0, float& s1, float decay, float scale,
                             const SegmentHyper& h) {
  if constexpr (R == SegmentRule::Sgd || R == SegmentRule::Lars) {
    float d = g;
    if constexpr (R == SegmentRule::Lars) d = (d + decay * p) * scale;
    else if (decay != 0.f) d += decay * p;
    if (h.momentum != 0.f) {
      s0 = h.first_step ? d : h.momentum * s0 + (1.f - h.dampening) * d;
      d = h.nesterov ? d + h.momentum * s0 : s0;
    }
    p -= h.lr * d;
  } else if constexpr (R == SegmentRule::Adam || R == SegmentRule::AdamW) {
    float d = g;
    if constexpr (R == SegmentRule::AdamW) p *= scale;
    else if (decay != 0.f) d += decay * p;
    s0 = h.beta1 * s0 + h.one_minus_beta1 * d;
    s1 = h.beta2 * s1 + h.one_minus_beta2 * d * d;
    const float denom = sqrtf(s1) / h.bias_correction2_sqrt + h.eps;
    p -= h.step_size * (s0 / denom);
  } else if constexpr (R == SegmentRule::RmsProp) {
    float d = g;
    if (decay != 0.f) d += decay * p;
    s0 = h.alpha * s0 + h.one_minus_alpha * d * d;
    const float avg = sqrtf(s0) + h.eps;
    if (h.momentum > 0.f) {
      s1 = h.momentum * s1 + d / avg;
      p -= h.lr * s1;
    } else {
      p -= h.lr * (d / avg);
    }
  } else if constexpr (R == SegmentRule::LambMoments) {
    const float d = g / h.grad_divisor;
    s0 = h.beta1 * s0 + h.one_minus_beta1 * d;
    s1 = h.beta2 * s1 + h.one_minus_beta2 * d * d;
    const float denom = sqrtf(s1) / h.bias_correction2_sqrt + h.eps;
    float u = (s0 / h.bias_correction1) / denom;
    if (decay != 0.f) u += decay * p;
    g = u;
  } else {
    static_assert(R == SegmentRule::ScaledDescent);
    p -= h.lr * (g * scale);
  }
}

// The same, the rule read at run time (the CUDA kernel: one rule per launch, no divergence).
RD_HD void segment_update(float& p, float& g, float& s0, float& s1, float decay, float scale,
                          const SegmentHyper& h) {
  switch (h.rule) {
    case SegmentRule::Sgd: return segment_update_as<SegmentRule::Sgd>(p, g, s0, s1, decay, scale, h);
    case SegmentRule::Lars: return segment_update_as<SegmentRule::Lars>(p, g, s0, s1, decay, scale, h);
    case SegmentRule::Adam: return segment_update_as<SegmentRule::Adam>(p, g, s0, s1, decay, scale, h);
    case SegmentRule::AdamW: return segment_update_as<SegmentRule::AdamW>(p, g, s0, s1, decay, scale, h);
    case SegmentRule::RmsProp: return segment_update_as<SegmentRule::RmsProp>(p, g, s0, s1, decay, scale, h);
    case SegmentRule::LambMoments:
      return segment_update_as<SegmentRule::LambMoments>(p, g, s0, s1, decay, scale, h);
    case SegmentRule::ScaledDescent:
      return segment_update_as<SegmentRule::ScaledDescent>(p, g, s0, s1, decay, scale, h);
  }
}

}  // namespace rd::math
