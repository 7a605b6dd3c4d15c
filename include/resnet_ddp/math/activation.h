// Per-element activation math (forward and backward side by side).
#pragma once
#include "resnet_ddp/math/hd.h"

namespace rd::math {

RD_HD float relu_forward(float x) { return x > 0.f ? x : 0.f; }
// Backward from the *output*: y > 0 exactly when x > 0, so no input is kept.
RD_HD float relu_backward(float y, float dy) { return y > 0.f ? dy : 0.f; }

// Residual add fused with ReLU: y = relu(a + b).
RD_HD float add_relu_forward(float a, float b) { return relu_forward(a + b); }

}  // namespace rd::math
