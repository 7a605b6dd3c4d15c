// Resuming a run: what a checkpoint fixes, what changed since, where training continues,
// and whether a command is a new experiment that must not silently continue the one in
// its output folder. Shared by training and `train --check`; no MPI here (functions of
// flags and metadata), so tests/train checks every decision in milliseconds.
#pragma once

#include <string>
#include <vector>

#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/cli.h"
#include "train/train_state.h"

namespace rd::train {

inline const char* const kStartFresh = "; to start fresh instead use --resume none or another --output-dir";

// --amp as timm and torch.autocast mean it on each device: fp16 on a GPU (every GPU
// with tensor cores has it; loss scaling is on), bf16 on the CPU (oneDNN's only
// reduced-precision training type).
inline Precision amp_precision(bool cuda) { return cuda ? Precision::FP16 : Precision::BF16; }

// Flags that do not describe the run (where it reads and writes, how it resumes).
bool resume_ignores(const std::string& flag);
// Flags that change how a run executes, not what it computes: a rerun that changes only
// these is the same experiment.
bool describes_execution(const std::string& flag);

// What plan_resume needs to know of the run that is starting.
struct ThisRun {
  bool cuda = false;  // computes on a GPU (for a checkpoint trained with --amp on --device auto)
  int world = 1;      // ranks
};

// The flags that define the model; a checkpoint fixes them.
struct ModelFlags {
  Arch arch = Arch::ResNet34;
  HeadKind head = HeadKind::Mlp;
  int image_size = 0;
  Normalize normalize = Normalize::None;
  int val_resize_size = 0, val_crop_size = 0;  // the evaluation transform it was validated with
  static ModelFlags of(const TrainOptions& o);
  void apply_to(TrainOptions& o) const;
};

// Everything a resume decides, as one value: rank 0 reads the checkpoint's metadata,
// makes the plan and broadcasts it (encode/decode); every rank applies it.
struct ResumePlan {
  bool resumed = false;                   // continues `checkpoint`
  std::string checkpoint;                 // the file resumed, or empty
  ModelFlags model;                       // this run's model flags, the checkpoint's where it fixes them
  std::vector<std::string> class_names;   // --eval-only: the checkpoint's classes (no Train folder needed)
  TrainState state;                       // where training continues
  bool honour_lr = false;                 // --lr differs: the learning rate restarts from it
  bool epochs_changed = false;
  // Rank 0's words, in the order they are printed.
  std::string model_settings;             // "Model settings from FILE: --arch ..." or empty
  std::vector<std::string> changes;       // "Resume: --lr 0.01 instead of the checkpoint's ..." lines
  std::vector<std::string> differences;   // what makes this command another experiment
  std::vector<std::string> start_lines;   // said once the checkpoint is loaded ("Resuming from ...", notices)

  std::string encode() const;
  static ResumePlan decode(const std::string& bytes);
};

// Plans continuing checkpoint `path` (metadata `m`): the model-defining flags it fixes
// (an explicit conflicting flag is an rd::UsageError naming both values, an absent one
// takes the checkpoint's), every other flag that differs from the checkpoint's run (not
// for --eval-only), and the state training continues from: the position in the epoch
// (re-sharded when the global batch changed), the learning rate (the checkpoint's, or
// --lr when it was changed), the scheduler's state.
ResumePlan plan_resume(const TrainOptions& o, const std::string& path, const io::CheckpointMeta& m, const ThisRun& run);

// The plan of a run that does not resume: a fresh start (or --init) at --lr.
ResumePlan plan_fresh(const TrainOptions& o);

// --init FILE: refuses weights of another --arch.
void check_init(const TrainOptions& o, const io::CheckpointMeta& m);
// Which weights of the --init file are read (--init-ema: its weight EMA).
io::CheckpointReader::Weights init_weights(const TrainOptions& o);
// What a run from --init `m` should be warned of (PyTorch weights without --normalize
// imagenet); "" when nothing.
std::string init_warning(const TrainOptions& o, const io::CheckpointMeta& m);

// This process's Slurm job (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_RESTART_COUNT) into the
// metadata of a checkpoint it writes; nothing outside Slurm.
void record_slurm_job(io::CheckpointMeta& m);

// Whether this process is a requeue of the Slurm job that wrote `m`: the same job id and
// step, started more times than when `m` was written. A second run in the same job (the
// next experiment of a job script) is not one.
bool requeue_of_writer(const io::CheckpointMeta& m);

// Auto-resume is for continuing a run (a requeue, a rerun after a stop). A command whose
// settings differ from the run in its output folder is more likely a new experiment
// that would otherwise silently continue the old one (or train nothing): refused
// (rd::UsageError listing the differences) unless --resume was given or this is a
// requeue of the Slurm job that wrote the checkpoint (requeue_of_writer), inside a Slurm
// job as outside.
void refuse_new_experiment(const TrainOptions& o, const std::string& path, const io::CheckpointMeta& m,
                           const std::vector<std::string>& differences);

}  // namespace rd::train
