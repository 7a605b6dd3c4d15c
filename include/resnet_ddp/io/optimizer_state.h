// The optimizer's and the scheduler's state as plain values: what a checkpoint stores
// and what train::Optimizer / train::Scheduler export and import. Defined here, below
// the trainer, so that the file formats know no optimizer object; train/optimizer.h
// names these types in rd::train too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "resnet_ddp/name_table.h"

namespace rd::io {

// Adam, Sgd: torch.optim with L2 decay; AdamW, RmsProp: torch.optim; Lars, Lamb: timm.optim.
enum class OptimizerKind { Adam, Sgd, AdamW, RmsProp, Lars, Lamb };
enum class SchedulerKind { Plateau, Cosine, None, Step, MultiStep, Exponential };
// --optimizer / --scheduler spellings, also the type names a checkpoint records.
inline NameTable<OptimizerKind> optimizer_names() {
  return {{"adam", OptimizerKind::Adam},       {"sgd", OptimizerKind::Sgd},   {"adamw", OptimizerKind::AdamW},
          {"rmsprop", OptimizerKind::RmsProp}, {"lars", OptimizerKind::Lars}, {"lamb", OptimizerKind::Lamb}};
}
// Adam's moments (exp_avg, exp_avg_sq, betas, eps) vs SGD's momentum (momentum, dampening, nesterov).
inline bool uses_adam_moments(OptimizerKind k) {
  return k == OptimizerKind::Adam || k == OptimizerKind::AdamW || k == OptimizerKind::Lamb;
}
// SGD-style momentum buffers are seeded with the first step's gradient: none exists before it.
inline bool momentum_seeded_by_first_step(OptimizerKind k) { return k == OptimizerKind::Sgd || k == OptimizerKind::Lars; }
inline NameTable<SchedulerKind> scheduler_names() {
  // The first name of a kind is what a checkpoint records; torchvision's spellings
  // (--lr-scheduler, lower case as its train.py compares them) follow.
  return {{"plateau", SchedulerKind::Plateau},         {"cosine", SchedulerKind::Cosine},
          {"none", SchedulerKind::None},               {"steplr", SchedulerKind::Step},
          {"multisteplr", SchedulerKind::MultiStep},   {"exponentiallr", SchedulerKind::Exponential},
          {"cosineannealinglr", SchedulerKind::Cosine}};
}

struct OptimizerConfig {
  OptimizerKind type = OptimizerKind::Adam;
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
  double momentum = 0.0, dampening = 0.0;         // sgd
  bool nesterov = false;
  // ---- optim: torchvision's param-group decays, RMSprop, timm's LARS / LAMB ----
  // Decay of batch-norm weights and biases / of every bias; < 0: unset (--weight-decay applies),
  // like torchvision's None. A bias of a norm layer takes bias_weight_decay when both are set.
  double norm_weight_decay = -1.0, bias_weight_decay = -1.0;
  double alpha = 0.9;            // rmsprop (torchvision's reference: alpha 0.9, eps 0.0316)
  double trust_coeff = 0.001;    // lars (timm)
  double max_grad_norm = 1.0;    // lamb's own global gradient clip (timm); <= 0: off
};

// One state tensor of an optimizer: params().size() floats in the parameters' layout,
// in the model backend's memory (not owned).
struct StateTensor {
  std::string name;  // exp_avg, exp_avg_sq (adam, adamw, lamb); momentum_buffer (sgd, lars); square_avg (rmsprop)
  float* data = nullptr;
};

// The /optimizer group. In a CheckpointMeta `tensors` is empty (they stream into the
// optimizer's own buffers through CheckpointReader::load_optimizer).
struct OptimizerState {
  bool present = false;
  OptimizerConfig config;  // config.lr is the initial LR
  int64_t step = 0;
  double lr = 0;  // the current LR
  std::vector<StateTensor> tensors;
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

// The /scheduler group.
struct SchedulerState {
  bool present = false;
  std::string type = "none";  // as recorded; a file may hold a type this build lacks
  int64_t last_epoch = 0;
  PlateauState plateau;
  CosineState cosine;
};

// The /model_ema group: torchvision's ExponentialMovingAverage (AveragedModel over
// parameters and buffers). `params` / `buffers` are views of the average's arenas (the
// model's layout, in the model backend's memory); empty in a CheckpointMeta.
struct EmaState {
  bool present = false;
  double decay = 0.0;             // the adjusted decay in use
  int64_t n_averaged = 0;
  int64_t num_batches_tracked = 0;  // averaged too (use_buffers=True), as torch's int64 buffer
  float* params = nullptr;
  float* buffers = nullptr;
};

}  // namespace rd::io
