// Training's options: the train command's flags with the reference recipe's defaults,
// their checks across flags, and the checks of their paths that run before any MPI work.
// A resume reads them back from the command line a checkpoint recorded. The program's
// subcommand table is in resnet_ddp/app/commands.h.
//
// Every parse error is an rd::UsageError whose message names the flag; the
// program prints it on rank 0 only and exits with status 2 on every rank (all
// ranks parse the same argv, so they agree without communicating).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "resnet_ddp/flags.h"
#include "resnet_ddp/shell_quote.h"
#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/option_types.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/scheduler.h"

namespace rd::train {

struct TrainOptions {
  std::string data;                  // ImageFolder root (Train/, Validation/) or packed .h5
  std::string train_split = "Train";      // folder names of the splits under `data`
  std::string val_split = "Validation";   // (ImageNet-style trees: train, val)
  Arch arch = Arch::ResNet34;
  HeadKind head = HeadKind::Mlp;     // mlp (Linear-ReLU-Linear) | fc
  int image_size = 244;
  int batch_size = 16;               // per rank
  int val_batch_size = 0;            // 0 = batch_size
  int epochs = 5;
  double lr = 1e-4;
  // timm's --lr-base: the lr for a global batch of lr_base_size, scaled to the run's
  // (lr_scaling.h); 0 = not given (--lr as set). lr_base_scale: auto (by optimizer, as timm), linear, sqrt.
  double lr_base = 0.0;
  int64_t lr_base_size = 256;
  std::string lr_base_scale = "auto";
  OptimizerKind optimizer = OptimizerKind::Adam;
  double momentum = 0.9;             // sgd, rmsprop, lars
  bool nesterov = false;             // sgd, lars
  double weight_decay = 0.0;
  // ---- optim: torchvision's param-group decays and gradient clipping ----
  double norm_weight_decay = -1.0;   // < 0: unset (batch-norm parameters take --weight-decay)
  double bias_weight_decay = -1.0;   // < 0: unset
  double clip_grad_norm = 0.0;       // 0: off
  double label_smoothing = 0.1;
  SchedulerKind scheduler = SchedulerKind::Plateau;
  bool sync_bn = true;  // SyncBatchNorm whenever world > 1 (the reference recipe)
  int workers = 2;                   // loader threads per rank
  int threads = 0;                   // compute threads per rank, 0 = cores / ranks on node
  int64_t seed = 0;
  std::string output_dir = "output_model";
  ResumeMode resume = ResumeMode::Auto;
  std::string resume_file;           // --resume FILE
  std::string init;                  // weights-only .h5
  bool init_ema = false;             // --init reads the file's weight EMA
  double bucket_mb = 25.0;
  // A thread that drives MPI progress during backward. Off by default: when compute
  // uses every core it steals cycles (measured: ResNet-34 backward 2.07 s -> 2.84 s
  // on 2 ranks x 1 thread), and polling between layers already overlaps most of it.
  bool progress_thread = false;
  int accum_steps = 1;
  double loss_scale = 65536.0;  // fp16: the dynamic loss scale to start from
  Device device = Device::Auto;
  Precision precision = Precision::FP32;
  // --amp: the mixed precision that suits the device, chosen once it is known (bf16 on
  // the CPU, fp16 on a GPU); a later --precision turns it off again.
  bool amp = false;
  ConvAlgo conv_algo = ConvAlgo::Auto;  // CPU fp32 3x3 convolutions
  // CUDA, one rank: each micro-batch's forward and backward replayed as CUDA graphs after
  // warm-up (train_step.h); no effect on the CPU.
  bool cuda_graphs = true;
  int64_t max_steps = 0;             // optimizer steps per epoch, 0 = whole epoch
  bool eval_only = false;
  std::string metrics;               // "" = OUTPUT_DIR/metrics.csv
  bool tensorboard = true;           // rank 0 writes OUTPUT_DIR/events.out.tfevents.*
  bool deterministic = false;
  int64_t log_every = 50;            // steps between progress lines when not on a TTY
  ProgressMode progress = ProgressMode::Auto;
  Augment augment = Augment::AutoAugment;
  Normalize normalize = Normalize::None;
  bool strict_data = false;
  bool skip_unreadable = false;      // --eval-only: unreadable images skipped and counted, not an error
  bool jpeg_draft = false;           // DCT-domain JPEG downscaling to >= image_size (ScanOptions::jpeg_draft)
  VerifyData verify_data = VerifyData::Full;  // scan: decode every image, or read headers only
  int64_t checkpoint_every = 0;      // optimizer steps between mid-epoch last.h5 saves, 0 = off
  bool check = false;                // dry run: validate everything, train nothing (check_main)
  // MixUp / CutMix and repeated augmentation (torchvision's reference flags).
  double mixup_alpha = 0.0;          // Beta(alpha, alpha) MixUp on the batch, 0 = off
  double cutmix_alpha = 0.0;         // Beta(alpha, alpha) CutMix on the batch, 0 = off
  bool ra_sampler = false;           // RASampler instead of DistributedSampler
  int ra_reps = 3;                   // RASampler's repetitions

  // LR schedule and weight EMA (torchvision reference train.py; cli.cpp add_sched_flags).
  int64_t lr_step_size = 30;         // --lr-step-size (steplr)
  double lr_gamma = 0.1;             // --lr-gamma (steplr, multisteplr, exponentiallr)
  std::vector<int64_t> lr_milestones;  // --lr-milestones (multisteplr)
  double lr_min = 0.0;               // --lr-min: cosine eta_min
  int64_t lr_warmup_epochs = 0;      // --lr-warmup-epochs, 0 = no warmup
  WarmupMethod lr_warmup_method = WarmupMethod::Constant;
  double lr_warmup_decay = 0.01;     // LinearLR start_factor / ConstantLR factor
  bool model_ema = false;            // --model-ema
  int64_t model_ema_steps = 32;      // EMA update every N steps of an epoch
  double model_ema_decay = 0.99998;  // before the reference's adjustment

  // ---- data: torchvision's reference presets (cli.cpp add_data_flags) ----
  int train_crop_size = 0;   // > 0: RandomResizedCrop(N) + flip + policy instead of --augment + Resize
  double hflip_prob = 0.5;   // RandomHorizontalFlip p of that preset
  AutoAugmentPolicy auto_augment = AutoAugmentPolicy::None;
  int ra_magnitude = 9;
  double random_erase = 0.0;   // RandomErasing p (after Normalize)
  int val_resize_size = 0;   // > 0 (with val_crop_size): eval = Resize(R) + CenterCrop(C)
  int val_crop_size = 0;

  // Flags given on the command line (as typed, e.g. "--no-sync-bn"): on resume only
  // these may override what the checkpoint records.
  std::vector<std::string> given;
  bool was_given(const std::string& flag) const;

  // The full command line (shell-quoted), recorded in checkpoints.
  std::string command_line;
  std::string recipe;                // --recipe NAME ("" = none): its flags are in the fields above
  // Defaults that depend on other flags.
  std::string metrics_path() const;
  // The checkpoint this run starts from: --resume FILE, or under --resume auto
  // OUTPUT_DIR/last.h5 when it exists; empty for a fresh start.
  std::string resume_checkpoint() const;
  int effective_val_batch() const { return val_batch_size > 0 ? val_batch_size : batch_size; }
};

// The LR schedule the flags describe (--scheduler, --lr-*).
SchedulerConfig scheduler_config(const TrainOptions& o);

// The train command's flags (with timm's and PyTorch's spellings, and timm's args.yaml
// as a --config) targeting `o`.
void add_train_command_flags(FlagSet& fs, TrainOptions& o);
// After the flags: the checks across them (rd::UsageError naming the flag), the defaults
// that depend on others, and the command line to record. `given`: the flags as typed;
// `words`: the program and command words, then the flags as applied (a config file's
// written out).
void finish_train_options(TrainOptions& t, std::vector<std::string> given, const std::vector<std::string>& words);
// A recorded train command line (the program, "train" or not, then its flags) read as
// the program reads it; rd::UsageError when it is not one.
TrainOptions parse_train_command_line(const std::vector<std::string>& words);

// Checks that need the filesystem but no MPI: data path exists, --init and an
// explicit --resume file exist, the output directory can be created and written.
// `probe_output` is false on ranks other than 0 (only rank 0 writes).
void check_train_paths(const TrainOptions& opts, bool probe_output);

// The image transforms `o` selects (training's and evaluation's share one config).
data::TransformConfig transform_config(const TrainOptions& o);
// The side length the model sees in evaluation (--val-crop-size, else --image-size).
int eval_image_size(const TrainOptions& o);

// Every train flag with its value in `o`, typed and as text (numbers in a canonical form,
// booleans "on"/"off"), in --help order: for comparing a run with the one a checkpoint
// recorded.
std::vector<FlagSet::Value> train_flag_settings(const TrainOptions& o);
// The same, text only.
std::vector<std::pair<std::string, std::string>> train_flag_values(const TrainOptions& o);

}  // namespace rd::train
