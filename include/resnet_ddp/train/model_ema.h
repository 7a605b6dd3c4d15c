// The weight EMA of torchvision's reference train.py (--model-ema):
// ExponentialMovingAverage, an AveragedModel(use_buffers=True) whose avg_fn is
// decay * average + (1 - decay) * model, over the parameters AND the buffers (BN running
// statistics; num_batches_tracked as torch's int64 buffer). The average lives in two
// flat arenas of the model's layout and is updated by one backend op each.
#pragma once

#include <cstdint>
#include <memory>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/io/optimizer_state.h"
#include "resnet_ddp/nn/resnet.h"

namespace rd::train {

class ModelEma {
 public:
  // The reference's decay adjustment: alpha = min(1, (1 - decay) * world * batch *
  // steps / epochs), decay = 1 - alpha.
  static double adjusted_decay(int64_t world, int64_t batch_size, int64_t steps, int64_t epochs, double decay);

  // decay * averaged + (1 - decay) * current for an int64 buffer (num_batches_tracked):
  // torch computes it in float32 and copy_ truncates back to int64.
  static int64_t average_count(int64_t averaged, int64_t current, float decay, float one_minus_decay);

  // Starts as a copy of `model` with n_averaged = 0 (AveragedModel deep-copies it).
  // `every_steps` (--model-ema-steps) and `warmup_epochs` (--lr-warmup-epochs) drive
  // after_optimizer_step as the reference's loop does.
  ModelEma(ResNet& model, double decay, int64_t every_steps = 1, int64_t warmup_epochs = 0);

  // The training loop's hooks.
  // Training starts: rank 0's resumed average on every rank (`resumed`, with the
  // checkpoint's counters; `comm` carries device memory), or a fresh copy of the
  // weights every rank now holds.
  void start(ResNet& model, dist::Comm& comm, bool resumed, int64_t n_averaged, int64_t num_batches_tracked);
  // After each optimizer update, step_in_epoch 0-based: the reference's EMA step, every
  // every_steps-th step of an epoch (counted from its first); during warmup epochs the
  // average restarts from the weights each time.
  void after_optimizer_step(ResNet& model, int64_t epoch, int64_t step_in_epoch);
  // `evaluate` run with the average in the model's arenas (the reference's "Test: EMA"),
  // the model's own weights back afterwards.
  template <class Evaluate>
  void evaluate_average(ResNet& model, Evaluate&& evaluate) {
    swap_in(model);
    evaluate();
    swap_out(model);
  }

  double decay() const { return decay_; }
  int64_t n_averaged() const { return n_averaged_; }
  int64_t num_batches_tracked() const { return nbt_; }
  // AveragedModel.update_parameters: a copy while n_averaged is 0, else the average.
  void update(ResNet& model);
  // The reference keeps copying the weights during warmup epochs this way.
  void reset_count() { n_averaged_ = 0; }
  // A fresh average: a copy of `model` with n_averaged = 0 (a run without EMA state to resume).
  void restart(ResNet& model);

  // The average in the model's arenas for an evaluation, and the model back after it.
  void swap_in(ResNet& model);
  void swap_out(ResNet& model);

  io::EmaState export_state();
  // The counters; the arenas are filled through export_state()'s views.
  void import_state(const io::EmaState& s);

 private:
  void copy(ResNet& model, float* params, float* buffers, bool into_model);

  Backend& backend_;
  double decay_;
  int64_t every_steps_, warmup_epochs_;
  int64_t n_averaged_ = 0;
  int64_t nbt_ = 0;
  size_t params_size_, buffers_size_;
  std::shared_ptr<void> params_, buffers_, saved_params_, saved_buffers_;
};

}  // namespace rd::train
