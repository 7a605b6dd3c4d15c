// torch computes each LR as Python does, one rounding per operation; -march=native
// would let GCC fuse a * b + c into an FMA and drift from it in the last bits.
#include "resnet_ddp/exact_fp.h"  // first: no FMA contraction in this file

#include "resnet_ddp/train/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rd::train {

namespace {
constexpr double kPi = 3.141592653589793;  // Python's math.pi
}

Scheduler::Scheduler(const SchedulerConfig& cfg) : cfg_(cfg) {
  plateau.best = std::numeric_limits<double>::infinity();
  cosine.t_max = std::max<int64_t>(cfg.epochs - cfg.warmup_epochs, 1);
  cosine.eta_min = cfg.eta_min;
  cosine.base_lr = cfg.base_lr;
}

Scheduler::Scheduler(SchedulerKind kind, double base_lr, int64_t epochs)
    : Scheduler([&] {
        SchedulerConfig c;
        c.kind = kind;
        c.base_lr = base_lr;
        c.epochs = epochs;
        return c;
      }()) {}

double Scheduler::initial_lr() const {
  // LinearLR and ConstantLR both multiply initial_lr by their factor at epoch 0; every
  // main schedule leaves it as it is (milestones are > 0).
  return cfg_.warmup_epochs > 0 ? cfg_.base_lr * cfg_.warmup_decay : cfg_.base_lr;
}

SchedulerState Scheduler::export_state() const {
  SchedulerState s;
  s.present = true;
  s.type = type();
  s.last_epoch = last_epoch_;
  s.plateau = plateau;
  s.cosine = cosine;
  return s;
}

void Scheduler::import_state(const SchedulerState& s) {
  if (!s.present || s.type != type()) return;  // a changed --scheduler starts fresh
  last_epoch_ = s.last_epoch;
  // Checkpoints hold only their own type's fields.
  if (kind() == SchedulerKind::Plateau) plateau = s.plateau;
  if (kind() == SchedulerKind::Cosine) cosine = s.cosine;
}

double Scheduler::step(double lr, double val_loss) {
  const int64_t e = ++last_epoch_;
  const int64_t w = cfg_.warmup_epochs;
  if (e < w) return warmup_step(lr, e);
  // SequentialLR: at the milestone the main schedule is stepped with step(0), which
  // takes its closed form at epoch 0.
  if (w > 0 && e == w) return main_closed_form_at_zero();
  return main_step(lr, e - w, val_loss);
}

// The warmup scheduler's recursive form at its epoch e (1 <= e < warmup epochs).
double Scheduler::warmup_step(double lr, int64_t e) const {
  if (cfg_.warmup_method == WarmupMethod::Constant) return lr;  // ConstantLR: unchanged before total_iters
  // LinearLR(start_factor = decay, end_factor = 1, total_iters = warmup), in torch's order.
  const double start = cfg_.warmup_decay, end = 1.0;
  const double total = static_cast<double>(cfg_.warmup_epochs);
  return lr * (1.0 + (end - start) / (total * start + static_cast<double>(e - 1) * (end - start)));
}

double Scheduler::main_closed_form_at_zero() const {
  if (cfg_.kind == SchedulerKind::Cosine)
    return cosine.eta_min +
           (cosine.base_lr - cosine.eta_min) * (1.0 + std::cos(kPi * 0.0 / static_cast<double>(cosine.t_max))) / 2.0;
  return cfg_.base_lr;  // base_lr * gamma ** 0 (milestones are > 0); none: constant
}

// The main schedule's recursive form at its epoch e >= 1.
double Scheduler::main_step(double lr, int64_t e, double val_loss) {
  switch (cfg_.kind) {
    case SchedulerKind::Plateau: {
      PlateauState& p = plateau;
      // mode "min", threshold_mode "rel": better when below best * (1 - threshold).
      if (val_loss < p.best * (1.0 - p.threshold)) {
        p.best = val_loss;
        p.num_bad_epochs = 0;
      } else {
        ++p.num_bad_epochs;
      }
      if (p.cooldown_counter > 0) {
        --p.cooldown_counter;
        p.num_bad_epochs = 0;
      }
      if (p.num_bad_epochs > p.patience) {
        const double new_lr = std::max(lr * p.factor, p.min_lr);
        if (lr - new_lr > p.eps) lr = new_lr;
        p.cooldown_counter = p.cooldown;
        p.num_bad_epochs = 0;
      }
      return lr;
    }
    case SchedulerKind::Step:
      return e % cfg_.step_size != 0 ? lr : lr * cfg_.gamma;
    case SchedulerKind::MultiStep:
      // Milestones are distinct, so gamma ** count is gamma.
      return std::binary_search(cfg_.milestones.begin(), cfg_.milestones.end(), e) ? lr * cfg_.gamma : lr;
    case SchedulerKind::Exponential:
      return lr * cfg_.gamma;
    case SchedulerKind::Cosine: {
      const int64_t t_max = cosine.t_max;
      const double T = static_cast<double>(t_max), eta_min = cosine.eta_min;
      if ((e - 1 - t_max) % (2 * t_max) == 0) return lr + (cosine.base_lr - eta_min) * (1.0 - std::cos(kPi / T)) / 2.0;
      return (1.0 + std::cos(kPi * static_cast<double>(e) / T)) /
                 (1.0 + std::cos(kPi * static_cast<double>(e - 1) / T)) * (lr - eta_min) +
             eta_min;
    }
    case SchedulerKind::None:
      break;
  }
  return lr;
}

}  // namespace rd::train
