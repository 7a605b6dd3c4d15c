// The run's own state, as one plain value: where training stands (epoch, step, best
// accuracy), the optimizer's and scheduler's position, and the running sums of an
// interrupted epoch. plan_resume derives it from a checkpoint's metadata, rank 0
// broadcasts it with the plan, the epoch loop advances it and save() records it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "resnet_ddp/train/scheduler.h"

namespace rd::train {

struct TrainState {
  int64_t epoch = 0;          // completed epochs
  int64_t step_in_epoch = 0;  // optimizer steps already done in epoch `epoch`
  int64_t global_step = 0;
  double best_val_acc = -1.0;
  double best_val_loss = 0.0;
  // Global training sums of the steps already done in epoch `epoch` (a resumed
  // interruption): the epoch's averages include them.
  double partial_loss_sum = 0.0;
  int64_t partial_correct = 0;
  int64_t partial_count = 0;
  // The optimizer continues from these (false: it starts fresh at --lr).
  bool has_optimizer_state = false;
  int64_t optimizer_steps = 0;
  double lr = 0.0;
  // The scheduler continues from these (false: a fresh schedule).
  bool has_scheduler_state = false;
  int64_t scheduler_last_epoch = 0;
  PlateauState plateau;
  CosineState cosine;
  int64_t num_batches_tracked = 0;  // BatchNorm's counter, read from the loaded weights
  // --model-ema continues from the checkpoint's average (false: a copy of the weights).
  bool has_ema_state = false;
  int64_t ema_n_averaged = 0;
  int64_t ema_num_batches_tracked = 0;
};
// Broadcast as raw bytes.
static_assert(std::is_trivially_copyable_v<TrainState>);

}  // namespace rd::train
