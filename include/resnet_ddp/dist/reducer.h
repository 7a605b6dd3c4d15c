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

  // A device communicator: finish_on_device() can end the pass without a host wait, so a
  // backward with its buckets can be recorded as a CUDA graph (train::TrainStep).
  virtual bool waits_on_device() const { return false; }
  // As finish(), but the device's compute stream waits for the buckets, not the host
  // (Request::wait_on_device); a host communicator waits as finish() does.
  virtual void finish_on_device() { finish(); }
  // A recorded pass (begin_backward .. finish_on_device) was replayed: what it would have
  // done on the host (the statistics) is done here.
  virtual void count_replayed_pass() {}
};

}  // namespace rd::dist
