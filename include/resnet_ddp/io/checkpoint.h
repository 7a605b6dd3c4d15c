// HDF5 checkpoints (layout: docs/checkpoint_format.md).
//
// One writer (write_checkpoint: a model's arenas, optimizer and scheduler state -> file)
// and one reader (CheckpointReader: file -> arenas and optimizer state, and the tensor
// list `info` prints). The optimizer and scheduler come in as plain state
// (optimizer_state.h), so this layer knows no trainer object. Both move one tensor at a time through a host buffer of the largest
// tensor's size: a host copy of ResNet-34 with Adam state is ~250 MB, which made
// the end-of-run evaluation of best_model.h5 the peak of a whole run. Writes are
// atomic (temp file in the same directory written directly by HDF5, fsync, rename,
// fsync of the directory) and carry a CRC-32 that the reader checks before HDF5
// parses the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "resnet_ddp/io/optimizer_state.h"

namespace rd {
class Arena;
class ResNet;
struct ResNetConfig;
}

namespace rd::io {

inline constexpr int64_t kCheckpointFormatVersion = 1;

// Where a run stands: what a checkpoint records of training's progress and what a
// resume restores. The trainer's state (src/train/train_state.h) is this plus the
// optimizer's and scheduler's position, so the two cannot drift apart.
struct RunPosition {
  int64_t epoch = 0;          // completed epochs
  int64_t step_in_epoch = 0;  // optimizer steps done in epoch `epoch`; > 0 only in a preemption checkpoint
  int64_t global_step = 0;
  double best_val_acc = -1.0;  // < 0: no evaluation yet
  double best_val_loss = 0.0;
  // Global training sums of the steps already done in epoch `epoch` (an interrupted
  // epoch): the epoch's averages include them.
  double partial_loss_sum = 0.0;
  int64_t partial_correct = 0;
  int64_t partial_count = 0;
  // What both readers refuse: a negative epoch or step counter.
  bool has_negative_counter() const { return epoch < 0 || step_in_epoch < 0 || global_step < 0; }
};

// How one RunPosition field is stored. The HDF5 writer and reader, the safetensors
// export and reader and `info --json` all follow this list, so a new field is added in
// for_each_position_field and nowhere else.
struct PositionField {
  const char* name;  // the HDF5 attribute and the safetensors __metadata__ key
  // A full checkpoint must hold it (a weights-only file may lack any field; a missing
  // optional one reads as RunPosition's default).
  bool required;
  bool preemption_only;  // written only when step_in_epoch > 0 (and not shown by info)
  // What `export` writes to __metadata__ (and the safetensors reader reads back).
  enum class Export { No, WhenPositive, WhenEvaluated } exported;
};

// Calls visit(field, value) for each field of `p` (const or not), in file order.
template <class Position, class Visit>
void for_each_position_field(Position& p, Visit&& visit) {
  using E = PositionField::Export;
  visit(PositionField{"epoch", true, false, E::WhenPositive}, p.epoch);
  visit(PositionField{"step_in_epoch", false, false, E::No}, p.step_in_epoch);
  visit(PositionField{"global_step", true, false, E::WhenPositive}, p.global_step);
  visit(PositionField{"best_val_acc", true, false, E::WhenEvaluated}, p.best_val_acc);
  visit(PositionField{"best_val_loss", false, false, E::WhenEvaluated}, p.best_val_loss);
  visit(PositionField{"partial_train_loss_sum", false, true, E::No}, p.partial_loss_sum);
  visit(PositionField{"partial_train_correct", false, true, E::No}, p.partial_correct);
  visit(PositionField{"partial_train_count", false, true, E::No}, p.partial_count);
}

// Whether `export` writes field `f` of `p` (holding `value`).
template <class T>
bool exported(const PositionField& f, const RunPosition& p, T value) {
  switch (f.exported) {
    case PositionField::Export::WhenPositive: return value > 0;
    case PositionField::Export::WhenEvaluated: return p.best_val_acc >= 0;
    default: return false;
  }
}

// Everything a checkpoint holds except its tensors: its RunPosition (a base, so
// `meta.global_step` reads as before) and what describes the model and the run.
// write_checkpoint takes the optimizer and scheduler parts from the states it is
// given, not from here.
struct CheckpointMeta : RunPosition {
  int64_t format_version = kCheckpointFormatVersion;
  std::string arch, head;
  int64_t num_classes = 0;
  int64_t image_size = 0;
  // Evaluation = Resize(val_resize_size) + CenterCrop(val_crop_size) when > 0 (torchvision's
  // eval preset), else Resize((image_size, image_size)); 0 in files from before.
  int64_t val_resize_size = 0, val_crop_size = 0;
  double val_acc = -1.0;
  double val_loss = 0.0;
  int64_t world_size = 1;
  int64_t batch_size = 0;
  int64_t accum_steps = 1;
  int64_t seed = 0;
  std::string args;
  // The command lines of the run that started training and of each resume since, oldest
  // first (the last one is `args`); empty in files written before it was recorded.
  std::vector<std::string> args_history;
  std::string created_by;
  // The Slurm job that wrote the file: SLURM_JOB_ID ("" outside Slurm), SLURM_STEP_ID
  // ("" when unset) and SLURM_RESTART_COUNT (its requeues so far). Only a later requeue
  // of that job may continue the run with other flags unasked (refuse_new_experiment);
  // files from before have none, so no job counts as theirs.
  std::string slurm_job_id, slurm_step_id;
  int64_t slurm_restart_count = 0;
  std::string normalize = "none";
  std::vector<std::string> class_names;
  std::string container = "hdf5";  // or "safetensors" (weights and metadata only), "pytorch" (.pth: weights only)
  OptimizerState optimizer;  // without tensors
  SchedulerState scheduler;
  EmaState ema;  // --model-ema's counters (the tensors: CheckpointReader::load_ema)
};

// The stored name of each CheckpointMeta field outside RunPosition: its HDF5 attribute
// (or string-list dataset), and its safetensors __metadata__ key where `export` writes
// one. The writer, both readers and `export` spell them only through these.
namespace meta_key {
inline constexpr char format_version[] = "format_version";
inline constexpr char arch[] = "arch";
inline constexpr char head[] = "head";
inline constexpr char num_classes[] = "num_classes";
inline constexpr char image_size[] = "image_size";
inline constexpr char val_resize_size[] = "val_resize_size";
inline constexpr char val_crop_size[] = "val_crop_size";
inline constexpr char val_acc[] = "val_acc";
inline constexpr char val_loss[] = "val_loss";
inline constexpr char world_size[] = "world_size";
inline constexpr char batch_size[] = "batch_size";
inline constexpr char accum_steps[] = "accum_steps";
inline constexpr char seed[] = "seed";
inline constexpr char args[] = "args";
inline constexpr char created_by[] = "created_by";
inline constexpr char normalize[] = "normalize";
inline constexpr char slurm_job_id[] = "slurm_job_id";
inline constexpr char slurm_step_id[] = "slurm_step_id";
inline constexpr char slurm_restart_count[] = "slurm_restart_count";
inline constexpr char class_names[] = "class_names";
inline constexpr char args_history[] = "args_history";
}  // namespace meta_key

// One /state_dict entry as stored: float32 of `shape`, or an int64 scalar
// (num_batches_tracked).
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  bool is_int64_scalar = false;
  int64_t int_value = 0;
};

// One entry of torchvision's state_dict, in its order: slice `slice` of `arena`
// (params() or buffers()), or a BN's num_batches_tracked when arena is null.
struct StateEntry {
  std::string name;
  const Arena* arena = nullptr;
  size_t slice = 0;
};
// The one definition of that order (a BN's buffers follow its weight and bias), shared
// by the HDF5 writer and the safetensors export.
std::vector<StateEntry> state_dict_order(ResNet& model);

// Atomic write in torchvision's state_dict order, straight from the arenas.
// Throws rd::Error naming the path (the previous file stays intact).
// `opt` and `sched` (Optimizer/Scheduler::export_state()) may be null: a weights-only file.
// `ema` (ModelEma::export_state(), --model-ema) adds the /model_ema group.
void write_checkpoint(const std::string& path, ResNet& model, const OptimizerState* opt, const SchedulerState* sched,
                      const CheckpointMeta& meta, const EmaState* ema = nullptr);

// A checkpoint opened for reading: HDF5 (ours, tools/torch_to_h5.py's, h5py's) or
// safetensors (weights and __metadata__ only, see docs/interop.md), both read through
// one TensorSource (src/io/tensor_source.h). A PyTorch .pth/.pt is refused with the
// converter command; an HDF5 file of ours that fails its checksum is refused before
// HDF5 parses it (src/io/checksum.h). The constructor reads and checks everything
// but the tensors; weights_only (for --init files) reads /state_dict and whatever
// metadata exists. Every method throws rd::UsageError naming the file when it is
// not HDF5, not a resnet_ddp checkpoint, a newer version, damaged, or does not fit.
class CheckpointReader {
 public:
  // Which weights load_model reads: the model's, or its weight EMA (HDF5: /model_ema of a
  // --model-ema run; .pth: torchvision's checkpoint["model_ema"] or timm's
  // checkpoint["state_dict_ema"]). A file without that EMA is refused when opened.
  enum class Weights { Model, Ema };
  explicit CheckpointReader(const std::string& path, bool weights_only = false, Weights weights = Weights::Model);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const;
  const CheckpointMeta& meta() const;
  // Where load_model's tensors come from, for messages: "/state_dict", "/model_ema",
  // "checkpoint['model_ema']", ...
  const std::string& weights_origin() const;

  // Reads (and so verifies) every tensor; returns the state_dict's, in file order.
  std::vector<TensorInfo> check_tensors();
  // Reads each tensor the model has a slice for into that slice (from the weights chosen
  // when opened). With
  // allow_head_mismatch (for --init), head tensors whose shape differs are
  // skipped (all or none of the head); returns their names.
  std::vector<std::string> load_model(ResNet& model, bool allow_head_mismatch);
  // Reads the optimizer state tensors into `into.tensors` (Optimizer::export_state()),
  // after checking the saved optimizer is of into's type; the caller then imports
  // meta().optimizer for the step and LR.
  void load_optimizer(ResNet& model, const OptimizerState& into);
  // The /model_ema tensors into `into`'s arenas (the model's layout).
  void load_ema(ResNet& model, const EmaState& into);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The model a checkpoint describes (arch, head, classes), to build before loading it.
ResNetConfig model_config(const CheckpointMeta& meta);

// Checks that `meta` fits `model` (arch, head, classes) and throws rd::UsageError
// naming `path` and the first mismatch otherwise.
void check_compatible(const CheckpointMeta& meta, ResNet& model, const std::vector<std::string>& class_names,
                      const std::string& path);

}  // namespace rd::io
