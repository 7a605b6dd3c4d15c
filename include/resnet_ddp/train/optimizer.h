// Optimizers with PyTorch semantics (the LR schedulers: train/scheduler.h).
//
// The optimizer works on the model's flat parameter arena in one backend call per
// step, and keeps its state (Adam's exp_avg / exp_avg_sq, SGD's momentum_buffer,
// RMSprop's square_avg) in arenas of the same layout, so a parameter's state is the
// slice at the parameter's offset. What differs per parameter tensor (torchvision's
// norm / bias weight-decay groups, the trust ratios of timm's LARS and LAMB, the norms
// they and --clip-grad-norm need) goes through the per-segment backend ops, one call
// for the whole arena. The LR schedules are in train/scheduler.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/io/optimizer_state.h"
#include "resnet_ddp/name_table.h"
#include "resnet_ddp/nn/arena.h"

namespace rd::train {

// The plain-value types live with the file formats that store them (io/optimizer_state.h).
using io::OptimizerConfig;
using io::OptimizerKind;
using io::OptimizerState;
using io::optimizer_names;

class Optimizer {
 public:
  // `params` and `grads` share one slice layout; state is allocated on `backend`.
  Optimizer(Backend& backend, Arena& params, Arena& grads, const OptimizerConfig& cfg);

  const OptimizerConfig& config() const { return cfg_; }
  std::string type_name() const { return name_of(optimizer_names(), cfg_.type); }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  // Steps taken (skipped fp16 steps not counted). With a device step count (use_device_step)
  // a host read of it, which waits for the queued work: not for every step.
  int64_t steps() const;

  // fp16: the steps are decided and counted in the backend's memory (LossScaler's state):
  // an update with found_inf set there changes nothing, and the step count (Adam's bias
  // corrections, SGD's first step) is the device's.
  void use_device_step(math::AmpStepState* state) { amp_ = state; }

  // One update of every parameter from the current gradients (clipped first when
  // set_clip_grad_norm was given a limit).
  void step();

  // The learning rate and the step count live in the backend's memory, written before each
  // step (Backend::set_optimizer_scalars), so the update's device work can be recorded once
  // and replayed (TrainStep::update). True when that work needs no host read: not LARS,
  // LAMB or --clip-grad-norm, which read gradient norms on the host every step.
  bool step_is_recordable() const;
  // step() in two halves when step_is_recordable(): begin_step's host side (the step count,
  // the lr and count written to the backend) runs every step, outside any recording;
  // queue_update queues the update itself, which a replayed graph may stand in for.
  void begin_step();
  void queue_update();

  // torch.nn.utils.clip_grad_norm_(params, max_norm) before each step (0 = off). Under DDP
  // the gradients are all-reduced (and fp16-unscaled) before step(), so every rank
  // computes the same global norm and the same factor.
  void set_clip_grad_norm(double max_norm) { clip_grad_norm_ = max_norm; }
  // The global L2 norm of the gradients before the last clip (0 before any).
  double last_grad_norm() const { return last_grad_norm_; }
  // clip_grad_norm_ itself: scales the gradients by max_norm / (norm + 1e-6) when that is
  // below 1; returns the norm before clipping.
  double clip_gradients(double max_norm);
  // The weight decay each parameter slice gets (torchvision's set_weight_decay).
  const std::vector<float>& weight_decays() const { return decay_; }

  // State buffers: adam -> {exp_avg, exp_avg_sq}; sgd -> {momentum_buffer} (when
  // momentum > 0). Each has params().size() floats in the params' layout.
  size_t state_count() const;
  const char* state_name(size_t i) const;
  float* state(size_t i);

  // The whole state as plain values (the tensors as views of this optimizer's buffers),
  // and back: import_state takes the step and current LR; the tensors are filled in
  // place through export_state().tensors (CheckpointReader::load_optimizer, which also
  // refuses a state of another optimizer type).
  OptimizerState export_state();
  void import_state(const OptimizerState& s);

 private:
  Backend& backend_;
  Arena& params_;
  Arena& grads_;
  OptimizerConfig cfg_;
  double lr_;
  int64_t step_ = 0;
  math::AmpStepState* amp_ = nullptr;  // backend memory; null: the host counts the steps
  std::shared_ptr<void> scalars_memory_;
  math::OptimizerStepScalars* device_scalars_ = nullptr;  // in scalars_memory_
  math::OptimizerStepScalars written_scalars_{-1.0, -1.0};  // the last values written there
  std::shared_ptr<void> state_[2];
  // Per-segment (parameter slice) tables: [begin, end) offsets, decay, scale, and norms.
  std::vector<int64_t> ranges_;
  std::vector<float> decay_, scale_;
  std::vector<double> sq_params_, sq_grads_;
  bool segmented_ = false;  // false: one decay for all and adam/sgd: the original flat ops
  double clip_grad_norm_ = 0.0;
  double last_grad_norm_ = 0.0;

  math::AmpStepState read_device_step() const;
  // True when the update ops take the verdict and the step count from amp_ themselves.
  bool device_decides() const;
  bool reads_device_scalars() const;
  void write_step_scalars();
  void flat_step();
  void lars_step(math::SegmentHyper h);
  void lamb_step(math::SegmentHyper h);
  math::SegmentHyper segment_hyper() const;
};

// torchvision's references/classification/utils.set_weight_decay over the arena's names:
// a bias ("<module>.bias") takes bias_weight_decay when set (>= 0); else a parameter of a
// batch-norm module (one whose "<module>.weight" is 1-D) takes norm_weight_decay when set;
// else weight_decay. One value per slice.
std::vector<float> parameter_weight_decays(const Arena& params, const OptimizerConfig& cfg);

}  // namespace rd::train
