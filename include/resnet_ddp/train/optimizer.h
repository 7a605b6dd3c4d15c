// Optimizers and learning-rate schedulers with PyTorch semantics.
//
// The optimizer works on the model's flat parameter arena in one backend call per
// step (every parameter shares one param group), and keeps its state (Adam's
// exp_avg / exp_avg_sq, SGD's momentum_buffer) in arenas of the same layout, so a
// parameter's state is the slice at the parameter's offset.
//
// Schedulers are stepped once per epoch after validation, like the reference:
// ReduceLROnPlateau(mode="min") with the validation loss, CosineAnnealingLR(T_max =
// epochs), or none. Their arithmetic follows torch.optim.lr_scheduler exactly
// (double precision, the recursive cosine form), so the LR sequence matches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/nn/arena.h"

namespace rd::train {

enum class OptimizerKind { Adam, Sgd };
enum class SchedulerKind { Plateau, Cosine, None };
// --optimizer / --scheduler spellings, also the type names a checkpoint records.
inline NameTable<OptimizerKind> optimizer_names() { return {{"adam", OptimizerKind::Adam}, {"sgd", OptimizerKind::Sgd}}; }
inline NameTable<SchedulerKind> scheduler_names() {
  return {{"plateau", SchedulerKind::Plateau}, {"cosine", SchedulerKind::Cosine}, {"none", SchedulerKind::None}};
}

struct OptimizerConfig {
  OptimizerKind type = OptimizerKind::Adam;
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
  double momentum = 0.0, dampening = 0.0;         // sgd
  bool nesterov = false;
};

class Optimizer {
 public:
  // `params` and `grads` share one slice layout; state is allocated on `backend`.
  Optimizer(Backend& backend, Arena& params, Arena& grads, const OptimizerConfig& cfg);

  const OptimizerConfig& config() const { return cfg_; }
  std::string type_name() const { return name_of(optimizer_names(), cfg_.type); }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t steps() const { return step_; }
  void set_steps(int64_t s) { step_ = s; }

  // One update of every parameter from the current gradients.
  void step();

  // State buffers: adam -> {exp_avg, exp_avg_sq}; sgd -> {momentum_buffer} (when
  // momentum > 0). Each has params().size() floats in the params' layout.
  size_t state_count() const;
  const char* state_name(size_t i) const;
  float* state(size_t i);

 private:
  Backend& backend_;
  Arena& params_;
  Arena& grads_;
  OptimizerConfig cfg_;
  double lr_;
  int64_t step_ = 0;
  std::shared_ptr<void> state_[2];
};

struct PlateauState {
  // torch.optim.lr_scheduler.ReduceLROnPlateau defaults except factor/patience/min_lr.
  double factor = 0.1;
  int64_t patience = 5;
  double threshold = 1e-4;  // relative
  int64_t cooldown = 0;
  double min_lr = 1e-8;
  double eps = 1e-8;
  double best = 0.0;  // set to +inf on construction (mode min)
  int64_t num_bad_epochs = 0;
  int64_t cooldown_counter = 0;
};

struct CosineState {
  int64_t t_max = 1;
  double eta_min = 0.0;
  double base_lr = 0.0;
};

class Scheduler {
 public:
  // base_lr is the optimizer's initial LR.
  Scheduler(SchedulerKind kind, double base_lr, int64_t epochs);

  SchedulerKind kind() const { return kind_; }
  std::string type() const { return name_of(scheduler_names(), kind_); }  // as checkpoints record it
  // End of an epoch: takes the current LR and the validation loss, returns the new LR.
  double step(double current_lr, double val_loss);
  int64_t last_epoch() const { return last_epoch_; }
  void set_last_epoch(int64_t e) { last_epoch_ = e; }

  PlateauState plateau;
  CosineState cosine;

 private:
  SchedulerKind kind_;
  int64_t last_epoch_ = 0;
};

}  // namespace rd::train
