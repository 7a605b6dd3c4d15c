// HDF5 checkpoints (layout: docs/checkpoint_format.md).
//
// The file layer works on a host-side Snapshot, so the same code writes what a
// CPU or CUDA model holds; snapshot_model / restore_model move state between a
// ResNet (+ optimizer + scheduler) and a Snapshot. Writes are atomic (temp file
// in the same directory written directly by HDF5, fsync, rename, fsync of the
// directory). Saving and loading a model stream between its arenas and the
// file (write_checkpoint's ResNet overload, CheckpointReader) without a Snapshot.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "resnet_ddp/train/optimizer.h"

namespace rd {
class ResNet;
}

namespace rd::train {

inline constexpr int64_t kCheckpointFormatVersion = 1;

struct CheckpointMeta {
  int64_t format_version = kCheckpointFormatVersion;
  std::string arch, head;
  int64_t num_classes = 0;
  int64_t image_size = 0;
  int64_t epoch = 0;          // completed epochs
  int64_t step_in_epoch = 0;  // > 0 only in a preemption checkpoint
  int64_t global_step = 0;
  double best_val_acc = -1.0;
  double best_val_loss = 0.0;
  double val_acc = -1.0;
  double val_loss = 0.0;
  int64_t world_size = 1;
  int64_t batch_size = 0;
  int64_t accum_steps = 1;
  int64_t seed = 0;
  std::string args;
  std::string created_by;
  std::string normalize = "none";
  std::vector<std::string> class_names;
  // Running train statistics of an interrupted epoch (global sums).
  double partial_train_loss_sum = 0.0;
  int64_t partial_train_correct = 0;
  int64_t partial_train_count = 0;
};

// One state_dict entry: float32 tensor, or an int64 scalar (num_batches_tracked).
struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
  bool is_int64_scalar = false;
  int64_t int_value = 0;
};

struct OptimizerSnapshot {
  bool present = false;
  std::string type;
  int64_t step = 0;
  double lr = 0, initial_lr = 0, weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  // state name ("exp_avg", ...) -> one tensor per trainable parameter, param order.
  std::vector<std::pair<std::string, std::vector<HostTensor>>> states;
};

struct SchedulerSnapshot {
  bool present = false;
  std::string type = "none";
  int64_t last_epoch = 0;
  PlateauState plateau;
  CosineState cosine;
};

struct Snapshot {
  CheckpointMeta meta;
  std::vector<HostTensor> state_dict;  // torchvision state_dict order
  OptimizerSnapshot optimizer;
  SchedulerSnapshot scheduler;
};

// Atomic write. Throws rd::Error naming the path (the previous file stays intact).
void write_checkpoint(const std::string& path, const Snapshot& snap);
// The same file as write_checkpoint(path, snapshot_model(model, opt, sched, meta)),
// written straight from the model's arenas one tensor at a time: no Snapshot, so
// saving needs only the largest tensor's worth of extra host memory.
void write_checkpoint(const std::string& path, ResNet& model, const Optimizer* opt, const Scheduler* sched,
                      const CheckpointMeta& meta);

// Reads and validates the structure. weights_only: /state_dict (and whatever
// metadata exists) only, for --init files. Throws rd::UsageError naming the file
// when it is not HDF5, not a resnet_ddp checkpoint, a newer version, or damaged.
Snapshot read_checkpoint(const std::string& path, bool weights_only = false);

// Metadata without tensors (for `info`, resume decisions).
CheckpointMeta read_checkpoint_meta(const std::string& path);

// ---- file -> model, one tensor at a time -------------------------------------------
// A checkpoint opened for loading into a model. The constructor reads and checks
// everything read_checkpoint does except the tensors (metadata, optimizer and
// scheduler attributes); load_model / load_optimizer then read each tensor the
// model has a slice for straight into that slice through one staging buffer of
// the largest tensor's size. Loading therefore never holds the file's tensors in
// host memory (a Snapshot of ResNet-34 with Adam state is ~250 MB, which made
// the end-of-run evaluation of best_model.h5 the peak of a whole run). Checks
// and messages are those of restore_model / restore_optimizer; datasets the
// model has no slice for are not read. Throws rd::UsageError naming the file.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path, bool weights_only = false);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const;
  const CheckpointMeta& meta() const;
  // Attributes only: `states` stays empty (load_optimizer reads the tensors).
  const OptimizerSnapshot& optimizer() const;
  const SchedulerSnapshot& scheduler() const;

  // As restore_model(read_checkpoint(path), model, allow_head_mismatch, path).
  std::vector<std::string> load_model(ResNet& model, bool allow_head_mismatch);
  // As restore_optimizer(read_checkpoint(path), model, opt, path).
  void load_optimizer(ResNet& model, Optimizer& opt);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- model <-> snapshot -----------------------------------------------------------
// Copies parameters, BN buffers and num_batches_tracked (torchvision order), plus
// optimizer / scheduler state when given.
Snapshot snapshot_model(ResNet& model, const Optimizer* opt, const Scheduler* sched,
                        const CheckpointMeta& meta);

// Checks that `snap` fits `model` (arch, head, classes, every tensor and shape) and
// throws rd::UsageError naming `path` and the first mismatch otherwise.
void check_compatible(const Snapshot& snap, ResNet& model, const std::vector<std::string>& class_names,
                      const std::string& path);
void check_compatible(const CheckpointMeta& meta, ResNet& model, const std::vector<std::string>& class_names,
                      const std::string& path);

// Loads weights (and buffers) into the model. With allow_head_mismatch (for
// --init), head tensors whose shape differs are skipped; returns their names.
std::vector<std::string> restore_model(const Snapshot& snap, ResNet& model, bool allow_head_mismatch,
                                       const std::string& path);
void restore_optimizer(const Snapshot& snap, ResNet& model, Optimizer& opt, const std::string& path);
void restore_scheduler(const Snapshot& snap, Scheduler& sched);
void restore_scheduler(const SchedulerSnapshot& snap, Scheduler& sched);

}  // namespace rd::train
