// The run's own state, as one plain value: where training stands (the RunPosition a
// checkpoint records: epoch, step, best accuracy, the running sums of an interrupted
// epoch) and the optimizer's and scheduler's position. plan_resume derives it from a
// checkpoint's metadata, rank 0 broadcasts it with the plan, the epoch loop advances it
// and save() records it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/scheduler.h"

namespace rd::train {

// The position is a base so that the epoch loop reads its fields as the state's own
// and a checkpoint's position copies over in one assignment.
struct TrainState : io::RunPosition {
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
