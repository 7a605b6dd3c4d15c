// Learning-rate schedulers with PyTorch semantics, stepped once per epoch after
// validation like torchvision's reference train.py.
//
// The main schedule is ReduceLROnPlateau(mode="min", on the validation loss),
// StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR(T_max = epochs - warmup
// epochs, eta_min) or none. A warmup (LinearLR(start_factor = decay) or
// ConstantLR(factor = decay) over the warmup epochs) runs before it, chained the way
// SequentialLR(milestones = [warmup]) chains them: at the milestone the main schedule
// restarts from its closed form at epoch 0. The arithmetic is torch 1.13's chainable
// (recursive) form in double, on the optimizer's current LR, so the LR sequence equals
// torch's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "resnet_ddp/io/optimizer_state.h"
#include "resnet_ddp/name_table.h"

namespace rd::train {

// The plain-value types live with the file formats that store them (io/optimizer_state.h).
using io::CosineState;
using io::PlateauState;
using io::scheduler_names;
using io::SchedulerKind;
using io::SchedulerState;

enum class WarmupMethod { Linear, Constant };
inline NameTable<WarmupMethod> warmup_method_names() {
  return {{"linear", WarmupMethod::Linear}, {"constant", WarmupMethod::Constant}};
}

// What a schedule is (from the flags); SchedulerState is where it stands.
struct SchedulerConfig {
  SchedulerKind kind = SchedulerKind::None;
  double base_lr = 0.0;             // the optimizer's initial LR (torch's initial_lr)
  int64_t epochs = 1;               // the run's epochs, warmup included
  int64_t step_size = 30;           // steplr
  double gamma = 0.1;               // steplr, multisteplr, exponentiallr
  std::vector<int64_t> milestones;  // multisteplr: strictly increasing, > 0
  double eta_min = 0.0;             // cosine
  int64_t warmup_epochs = 0;        // 0 = no warmup
  WarmupMethod warmup_method = WarmupMethod::Constant;
  double warmup_decay = 0.01;  // LinearLR start_factor / ConstantLR factor
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& cfg);
  // A main schedule without warmup and with the defaults above.
  Scheduler(SchedulerKind kind, double base_lr, int64_t epochs);

  const SchedulerConfig& config() const { return cfg_; }
  SchedulerKind kind() const { return cfg_.kind; }
  std::string type() const { return name_of(scheduler_names(), cfg_.kind); }  // as checkpoints record it
  // The LR torch's schedulers set when they are built (epoch 0): the base LR times the
  // warmup's factor, if any.
  double initial_lr() const;
  // End of an epoch: takes the current LR and the validation loss, returns the new LR.
  double step(double current_lr, double val_loss);
  int64_t last_epoch() const { return last_epoch_; }

  PlateauState plateau;
  CosineState cosine;

  // The whole state as plain values, and back: a saved state of another type (a
  // changed --scheduler) is ignored, so the schedule starts fresh.
  SchedulerState export_state() const;
  void import_state(const SchedulerState& s);

 private:
  double warmup_step(double lr, int64_t e) const;
  double main_closed_form_at_zero() const;
  double main_step(double lr, int64_t e, double val_loss);

  SchedulerConfig cfg_;
  int64_t last_epoch_ = 0;
};

}  // namespace rd::train
