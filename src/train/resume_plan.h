// Resuming a run: what a checkpoint fixes, what changed since, and whether a command is
// a new experiment that must not silently continue the one in its output folder. Shared
// by training and `train --check` (no MPI here: functions of flags and metadata).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/cli.h"

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

struct ResumePlan {
  std::string model_settings;            // "Model settings from FILE: --arch ..." or empty
  std::vector<std::string> changes;      // "Resume: --lr 0.01 instead of the checkpoint's ..." lines
  std::vector<std::string> differences;  // what makes this command another experiment
  bool honour_lr = false;                // --lr differs: the learning rate restarts from it
  bool epochs_changed = false;
};

// Applies to `o` the model-defining flags checkpoint `path` (metadata `m`) fixes: an
// explicit conflicting flag is an rd::UsageError naming both values, an absent one takes
// the checkpoint's. Then lists every other flag that differs from the checkpoint's run
// (not for --eval-only). `this_run_cuda` says whether this run computes on a GPU (asked
// only for a checkpoint trained with --amp on --device auto).
ResumePlan plan_resume(TrainOptions& o, const std::string& path, const io::CheckpointMeta& m,
                       const std::function<bool()>& this_run_cuda);

// Auto-resume is for continuing a run (a requeue, a rerun after a stop). Outside Slurm a
// command whose settings differ from the run in its output folder is more likely a new
// experiment that would otherwise silently continue the old one (or train nothing):
// refused (rd::UsageError listing the differences) unless --resume was given. Under
// Slurm a requeued job resumes unasked, and the job scripts give each submission its
// own folder.
void refuse_new_experiment(const TrainOptions& o, const std::string& path, const io::CheckpointMeta& m,
                           const std::vector<std::string>& differences);

}  // namespace rd::train
