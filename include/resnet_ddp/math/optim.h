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

// fp16's step scalars (PyTorch AMP's GradScaler and the optimizer's step count), kept in
// backend memory so that no host read decides whether a step is skipped: the unscale op
// (Backend::amp_unscale) writes the verdict and advances the counts, and the update ops
// given a pointer to it (`amp` in their hyper-parameters) skip on found_inf and take their
// step count from `steps`. Doubles: one type, so a backend copies the block as it is.
struct AmpStepState {
  double loss_scale = 65536.0;
  double good_steps = 0.0;  // finite steps in a row since the scale last changed
  double found_inf = 0.0;   // the last unscaled step's verdict: 1, skipped
  double steps = 0.0;       // optimizer steps taken, skipped ones not counted
  double skipped = 0.0;     // steps skipped so far
};

// The optimizer's per-step scalars kept in backend memory (Backend::set_optimizer_scalars
// writes them before each step), so that a recorded optimizer step (a CUDA graph) reads the
// step's values when it runs instead of those it was recorded with. The update ops given a
// pointer to it (`scalars` in their hyper-parameters) take the learning rate from `lr` and
// the step count from `steps`, unless an AmpStepState is given too: its count wins.
struct OptimizerStepScalars {
  double lr = 0.0;     // the double torch keeps; the ops round it to float as the host did
  double steps = 0.0;  // 1-based count of steps taken, this one included
};

// GradScaler.update with its defaults: an overflow halves the scale (not below 1) and
// skips the step; 2000 finite steps in a row double it.
RD_HD void amp_finish_step(AmpStepState& s, bool found_inf) {
  s.found_inf = found_inf ? 1.0 : 0.0;
  if (found_inf) {
    s.loss_scale = fmax(s.loss_scale * 0.5, 1.0);
    s.good_steps = 0.0;
    s.skipped += 1.0;
    return;
  }
  s.steps += 1.0;
  s.good_steps += 1.0;
  if (fmod(s.good_steps, 2000.0) == 0.0) s.loss_scale *= 2.0;
}

// The loss gradient's scale with the loss scale on the device: float(loss_scale / divisor),
// rounded as the host's float(scale / group) was.
RD_HD float amp_grad_scale(const AmpStepState& s, float divisor) {
  return static_cast<float>(s.loss_scale / static_cast<double>(divisor));
}

// The factor that divides the loss scale out of the gradients.
RD_HD float amp_unscale_factor(const AmpStepState& s) { return static_cast<float>(1.0 / s.loss_scale); }

struct AdamHyper {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 - beta1^t
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

// The bias corrections of step t (1-based), from the float betas the caller stated.
RD_HD void adam_bias_corrections(AdamHyper& h, double t) {
  h.bias_correction1 = static_cast<float>(1.0 - pow(static_cast<double>(h.beta1), t));
  h.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(h.beta2), t)));
}

// One Adam step as the caller states it (torch.optim.Adam's defaults); the
// backends derive the per-step AdamHyper from it with adam_hyper().
struct AdamArgs {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;  // 1-based count of steps taken, this one included
  // Backend memory, may be null: the step count comes from amp->steps instead of `step`,
  // and nothing changes when amp->found_inf is set.
  const AmpStepState* amp = nullptr;
  // Backend memory, may be null: lr and (without amp) the step count come from there.
  const OptimizerStepScalars* scalars = nullptr;
};

inline AdamHyper adam_hyper(const AdamArgs& a) {
  AdamHyper h{};
  h.lr = a.lr, h.beta1 = a.beta1, h.beta2 = a.beta2, h.eps = a.eps, h.weight_decay = a.weight_decay;
  adam_bias_corrections(h, static_cast<double>(a.step));
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
  // Backend memory, may be null: first_step is amp->steps == 1 instead, and nothing
  // changes when amp->found_inf is set.
  const AmpStepState* amp = nullptr;
  // Backend memory, may be null: lr and (without amp) first_step = steps == 1 come from there.
  const OptimizerStepScalars* scalars = nullptr;
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
  // The exact values the step-dependent scalars above come from (segment_step_scalars).
  double exact_lr = 0.0, exact_beta1 = 0.9, exact_beta2 = 0.999;
  // Backend memory, may be null: the step-dependent scalars are recomputed from amp->steps
  // (segment_step_scalars), and nothing changes when amp->found_inf is set.
  const AmpStepState* amp = nullptr;
  // Backend memory, may be null: exact_lr (and lr) and, without amp, the step count come
  // from there, and AdamW's per-segment scale is adamw_decay_factor(lr, decay) instead of
  // the caller's `scale` (LARS's and LAMB's trust ratios are the host's: they never take it).
  const OptimizerStepScalars* scalars = nullptr;
};

// torch.optim.AdamW's parameter factor 1 - lr * weight_decay, formed in double (no fused
// multiply-add on a GPU) and rounded to float once: the host's and the device's agree.
RD_HD float adamw_decay_factor(double lr, float decay) {
#if defined(__CUDA_ARCH__)
  return static_cast<float>(__dsub_rn(1.0, __dmul_rn(lr, static_cast<double>(decay))));
#else
  return static_cast<float>(1.0 - lr * static_cast<double>(decay));
#endif
}

// The scalars that depend on the step count t (1-based): SGD's first step, Adam's and
// LAMB's bias corrections, Adam's step size (the division in double, as torch does).
RD_HD void segment_step_scalars(SegmentHyper& h, double t, bool adam_moments) {
  h.first_step = t == 1.0;
  if (!adam_moments) return;
  const double bias_correction1 = 1.0 - pow(h.exact_beta1, t);
  h.bias_correction1 = static_cast<float>(bias_correction1);
  h.step_size = static_cast<float>(h.exact_lr / bias_correction1);
  h.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(h.exact_beta2, t)));
}

// Whether a rule keeps Adam's moments (bias-corrected by the step count).
RD_HD bool segment_rule_uses_moments(SegmentRule r) {
  return r == SegmentRule::Adam || r == SegmentRule::AdamW || r == SegmentRule::LambMoments;
}

// The step count an update op uses given either block: the AmpStepState's when given (fp16
// counts only the steps it did not skip), else the OptimizerStepScalars'.
RD_HD double device_step_count(const AmpStepState* amp, const OptimizerStepScalars* scalars) {
  return amp ? amp->steps : scalars->steps;
}

// The hyper-parameters an update op applies: `h` itself, or, given OptimizerStepScalars
// and/or an AmpStepState, those of their learning rate and step count (the AmpStepState's
// count when both are given); false: the step was skipped (found_inf) and nothing may change.
RD_HD bool segment_hyper_for_step(SegmentHyper& h) {
  if (h.amp && h.amp->found_inf != 0.0) return false;
  if (h.scalars) {
    h.exact_lr = h.scalars->lr;
    h.lr = static_cast<float>(h.exact_lr);
  }
  if (h.amp || h.scalars)
    segment_step_scalars(h, device_step_count(h.amp, h.scalars), segment_rule_uses_moments(h.rule));
  return true;
}
// The scale segment `decay`'s elements get: AdamW's factor from the device's lr, else the caller's.
RD_HD float segment_scale_for_step(const SegmentHyper& h, float decay, float scale) {
  return h.scalars && h.rule == SegmentRule::AdamW ? adamw_decay_factor(h.exact_lr, decay) : scale;
}
RD_HD bool adam_hyper_for_step(AdamHyper& h, const AmpStepState* amp, const OptimizerStepScalars* scalars) {
  if (amp && amp->found_inf != 0.0) return false;
  if (scalars) h.lr = static_cast<float>(scalars->lr);
  if (amp || scalars) adam_bias_corrections(h, device_step_count(amp, scalars));
  return true;
}
RD_HD bool sgd_hyper_for_step(SgdHyper& h) {
  if (h.amp && h.amp->found_inf != 0.0) return false;
  if (h.scalars) h.lr = static_cast<float>(h.scalars->lr);
  if (h.amp || h.scalars) h.first_step = device_step_count(h.amp, h.scalars) == 1.0;
  return true;
}

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
