// The gradient all-reduce as a training step drives it (train::TrainStep), kept apart
// from MPI so the step builds where only the model and a backend do (tools/gpu_check.sh
// on a bare GPU host). dist::GradientBucketer implements it.
#pragma once

#include "resnet_ddp/nn/resnet.h"

namespace rd::dist {

class GradientReducer : public BackwardHooks {
 public:
  // false: the next backward only accumulates locally (gradient accumulation).
  virtual void set_sync(bool sync) = 0;
  // Arms the reduction for one backward pass (call before model.backward).
  virtual void begin_backward() = 0;
  // Waits for the reduction; the gradient arena then holds the average over ranks.
  virtual void finish() = 0;
  // Seconds finish() has waited so far (communication backward did not hide).
  virtual double exposed_comm_s() const = 0;
};

}  // namespace rd::dist
