#include "resnet_ddp/train/cli.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"
#include "resnet_ddp/io/safetensors.h"
#include "resnet_ddp/shell_quote.h"
#include "resnet_ddp/train/recipes.h"
#include "resnet_ddp/train/report.h"
#include "train/timm_args.h"

namespace fs = std::filesystem;

namespace rd::train {

bool TrainOptions::was_given(const std::string& flag) const {
  return std::find(given.begin(), given.end(), flag) != given.end();
}

std::string TrainOptions::metrics_path() const {
  if (!metrics.empty()) return metrics;
  return (fs::path(output_dir) / "metrics.csv").string();
}

std::string TrainOptions::resume_checkpoint() const {
  if (resume == ResumeMode::File) return resume_file;
  if (resume == ResumeMode::None) return "";
  std::error_code ec;
  const std::string last = (fs::path(output_dir) / "last.h5").string();
  return fs::exists(last, ec) ? last : "";
}

SchedulerConfig scheduler_config(const TrainOptions& o) {
  SchedulerConfig c;
  c.kind = o.scheduler;
  c.base_lr = o.lr;
  c.epochs = o.epochs;
  c.step_size = o.lr_step_size;
  c.gamma = o.lr_gamma;
  c.milestones = o.lr_milestones;
  c.eta_min = o.lr_min;
  c.warmup_epochs = o.lr_warmup_epochs;
  c.warmup_method = o.lr_warmup_method;
  c.warmup_decay = o.lr_warmup_decay;
  return c;
}

namespace {

// Issue #27's optimizer flags (torchvision reference spellings).
void add_optim_flags(FlagSet& fs, TrainOptions& o) {
  const auto optional_decay = [&fs](const std::string& flag, double* target, const std::string& help) {
    fs.custom(
        flag, "X|none", help,
        [flag, target](const std::string& v) {
          if (v == "none") return void(*target = -1.0);
          char* end = nullptr;
          const double d = std::strtod(v.c_str(), &end);
          if (v.empty() || *end != '\0' || !std::isfinite(d) || d < 0.0)
            throw UsageError(flag + ": expected a number >= 0 or none, got '" + v + "'");
          *target = d;
        },
        [target] { return *target < 0.0 ? std::string("none") : py_float(*target); });
  };
  optional_decay("--norm-weight-decay", &o.norm_weight_decay,
                 "weight decay of batch-norm weights and biases (none = --weight-decay)");
  optional_decay("--bias-weight-decay", &o.bias_weight_decay,
                 "weight decay of every bias, batch norm's included (none = as the other parameters)");
  fs.real("--clip-grad-norm", &o.clip_grad_norm, 0.0, false,
          "clip the global gradient norm (after the all-reduce and fp16 unscaling) to this; 0 = off");
}

// --lr-milestones "30,60,90": positive epochs, strictly increasing (MultiStepLR).
std::vector<int64_t> parse_milestones(const std::string& v) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = v.find(',', pos);
    const std::string item = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    errno = 0;
    const long long m = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE || m <= 0)
      throw UsageError("--lr-milestones " + v + ": expected positive epoch numbers separated by commas (e.g. 30,60,90)");
    if (!out.empty() && m <= out.back())
      throw UsageError("--lr-milestones " + v + ": milestones must be strictly increasing");
    out.push_back(m);
    if (comma == std::string::npos) return out;
    pos = comma + 1;
  }
}

// The train flags in --help (and values()) order, declared in two parts only to keep
// each function short.
void add_train_recipe_flags(FlagSet& fs, TrainOptions& o) {
  fs.path("--data", &o.data, "PATH",
          "dataset: ImageFolder root with Train/ and Validation/, or a .h5 from 'pack' (required)");
  fs.text("--train-split", &o.train_split, "NAME", "folder of the training split under --data (ImageNet-style: train)");
  fs.text("--val-split", &o.val_split, "NAME", "folder of the validation split under --data (ImageNet-style: val)");
  fs.config("--config", "more flags from FILE: one per line ('--batch-size 32' or 'batch-size = 32', # comments), "
                        "or a YAML mapping (.yaml/.yml: 'batch_size: 32'); the command line wins");
  fs.presets("--recipe", &o.recipe, recipe_help(), training_recipes());
  fs.enumeration("--arch", &o.arch, arch_names(),
            "model, by torchvision's name (resnet_tiny: a miniature model for tests)");
  fs.enumeration("--head", &o.head, head_names(),
            "classifier: mlp = Linear-ReLU-Linear (reference recipe), fc = torchvision's Linear");
  fs.integer("--image-size", &o.image_size, 32, "square input size after Resize", 4096);
  fs.integer("--batch-size", &o.batch_size, 1, "images per rank per step", 65536);
  fs.integer("--val-batch-size", &o.val_batch_size, 0, "images per rank per validation batch (0 = --batch-size)", 65536);
  fs.integer("--epochs", &o.epochs, 1, "number of epochs", 1000000);
  fs.real("--lr", &o.lr, 0.0, true, "learning rate");
  fs.real("--lr-base", &o.lr_base, 0.0, true,
          "derive the lr from the global batch (batch x ranks x accum) as timm: lr = LR_BASE x global / "
          "--lr-base-size (an --lr given wins)");
  fs.integer("--lr-base-size", &o.lr_base_size, 1, "the global batch --lr-base is the lr for (timm: 256)",
             std::numeric_limits<int32_t>::max());
  fs.choice("--lr-base-scale", &o.lr_base_scale, {"auto", "linear", "sqrt"},
            "how --lr-base follows the global batch: linear, sqrt (of the ratio), auto = sqrt for adam, adamw and "
            "lamb, else linear (timm's rule)");
  fs.enumeration("--optimizer", &o.optimizer, optimizer_names(),
                 "optimizer: adam, sgd, adamw, rmsprop (torch.optim; rmsprop as torchvision's reference: "
                 "alpha 0.9, eps 0.0316), lars, lamb (timm.optim defaults)");
  fs.real("--momentum", &o.momentum, 0.0, false, "momentum (sgd, rmsprop, lars)", 1.0);
  fs.boolean("--nesterov", &o.nesterov, "Nesterov momentum (sgd, lars)");
  fs.real("--weight-decay", &o.weight_decay, 0.0, false,
          "weight decay (L2 added to the gradient; adamw: decoupled; lars/lamb: timm's)");
  add_optim_flags(fs, o);
  fs.real("--label-smoothing", &o.label_smoothing, 0.0, false, "cross-entropy label smoothing", 1.0);
  fs.enumeration("--scheduler", &o.scheduler, scheduler_names(),
            "LR schedule per epoch (--lr-scheduler): plateau = ReduceLROnPlateau(val loss, factor 0.1, "
            "patience 5, min_lr 1e-8); cosine|cosineannealinglr = CosineAnnealingLR(T_max = epochs - "
            "warmup, eta_min --lr-min); steplr, multisteplr, exponentiallr as torch's (--lr-step-size, "
            "--lr-milestones, --lr-gamma)");
  fs.boolean("--sync-bn", &o.sync_bn,
             "batch-norm statistics over all ranks (SyncBatchNorm) [default: on, as the reference recipe]");
  fs.negated("--no-sync-bn", &o.sync_bn, "per-rank batch-norm statistics (plain BatchNorm under DDP)");
}

void add_train_run_flags(FlagSet& fs, TrainOptions& o) {
  fs.integer("--workers", &o.workers, 1, "data loader threads per rank", 256);
  fs.integer("--threads", &o.threads, 0, "compute threads per rank (0 = node cores / ranks on node)", 1024);
  fs.integer("--seed", &o.seed, 0, "seed for initialisation, sampler order and augmentation",
             std::numeric_limits<int64_t>::max());
  fs.path("--output-dir", &o.output_dir, "DIR", "where last.h5, best_model.h5 and metrics.csv go");
  fs.custom(
      "--resume", "auto|none|FILE",
      "auto = continue from OUTPUT_DIR/last.h5 if present; none = start fresh; or a checkpoint",
      [&o](const std::string& v) {
        o.resume = v == "auto" ? ResumeMode::Auto : v == "none" ? ResumeMode::None : ResumeMode::File;
        o.resume_file = o.resume == ResumeMode::File ? v : "";
      },
      [&o] {
        return o.resume == ResumeMode::File ? o.resume_file : o.resume == ResumeMode::None ? "none" : "auto";
      });
  fs.path("--init", &o.init, "FILE",
          "initial weights only: .h5 (a checkpoint, converted ImageNet weights), .safetensors or a PyTorch .pth "
          "(torchvision's, a state_dict or a training checkpoint)");
  fs.boolean("--init-ema", &o.init_ema,
             "--init takes the file's weight EMA: /model_ema of a --model-ema checkpoint, or a .pth training "
             "checkpoint's 'model_ema' (torchvision) or 'state_dict_ema' (timm)");
  fs.real("--bucket-mb", &o.bucket_mb, 0.0, true, "gradient all-reduce bucket size in MiB");
  fs.boolean("--progress-thread", &o.progress_thread,
             "drive MPI progress from a helper thread during backward (worth it when a core is spare)");
  fs.integer("--accum-steps", &o.accum_steps, 1, "micro-batches accumulated per optimizer step", 65536);
  fs.enumeration("--device", &o.device, device_names(), "compute device (auto = CUDA when available)");
  fs.enumeration("--precision", &o.precision, precision_names(),
            "compute precision (fp16 uses dynamic loss scaling)");
  fs.real("--loss-scale", &o.loss_scale, 0.0, true,
          "fp16: initial dynamic loss scale, halved on each overflow (PyTorch GradScaler's init_scale)");
  fs.boolean("--amp", &o.amp, "mixed precision for the device: --precision bf16 on the CPU, fp16 on a GPU");
  fs.on_set("--precision", [&o] { o.amp = false; });  // of --amp and --precision, the later wins
  fs.enumeration("--cuda-graphs", &o.cuda_graphs, std::vector<std::pair<std::string, bool>>{{"on", true}, {"off", false}},
                 "CUDA: replay each micro-batch's forward and backward (with their NCCL collectives) and the optimizer step as CUDA graphs once warm");
  fs.enumeration("--conv-algo", &o.conv_algo, conv_algo_names(),
            "CPU fp32 3x3 convolutions: Winograd where it is faster (auto), never, or wherever possible");
  fs.integer("--max-steps", &o.max_steps, 0, "stop each epoch after N optimizer steps (0 = full epoch; smoke runs)",
             std::numeric_limits<int64_t>::max());
  fs.boolean("--eval-only", &o.eval_only, "only evaluate the checkpoint (--resume or --init) on Validation");
  fs.path("--metrics", &o.metrics, "FILE.csv", "per-epoch metrics [default: OUTPUT_DIR/metrics.csv]");
  fs.enumeration("--tensorboard", &o.tensorboard, std::vector<std::pair<std::string, bool>>{{"on", true}, {"off", false}},
                 "per-step and per-epoch scalars as a TensorBoard event file in OUTPUT_DIR (rank 0)");
  fs.boolean("--deterministic", &o.deterministic,
             "bit-reproducible runs on the CPU backend, also across a resume");
  fs.integer("--log-every", &o.log_every, 0, "steps between progress lines when stdout is not a terminal (0 = off)",
             std::numeric_limits<int64_t>::max());
  fs.enumeration("--progress", &o.progress, progress_names(),
            "progress display: bar on a terminal, lines (--log-every) otherwise");
  fs.enumeration("--augment", &o.augment, augment_names(),
            "training augmentation before Resize (reference: autoaugment; with --train-crop-size: --auto-augment)");
  fs.enumeration("--normalize", &o.normalize, normalize_names(),
            "input normalisation after ToTensor (imagenet: for --init with ImageNet weights)");
  fs.boolean("--strict-data", &o.strict_data, "any unreadable image is an error instead of a skipped file");
  fs.boolean("--skip-unreadable", &o.skip_unreadable,
             "with --eval-only: skip unreadable validation images (counted, not scored) instead of failing");
  fs.boolean("--jpeg-draft", &o.jpeg_draft,
             "decode JPEGs scaled down by 1/2-1/8 in the DCT domain to >= --image-size (faster for large "
             "photos; pixels differ from torchvision's full decode)");
  fs.enumeration("--verify-data", &o.verify_data, verify_data_names(),
            "scan check: decode every image before training (full) or read headers only");
  fs.boolean("--check", &o.check,
             "dry run: validate the flags, config file, paths, output folder, device, checkpoint, dataset "
             "(headers) and launcher, then exit (0 = ready, 2 = the problem) without training");
  fs.integer("--checkpoint-every", &o.checkpoint_every, 0,
             "also write OUTPUT_DIR/last.h5 every N optimizer steps inside an epoch (0 = only at epoch ends)",
             std::numeric_limits<int64_t>::max());
}

// torchvision reference train.py's LR schedule and weight-EMA flags (--lr-scheduler is
// an alias of --scheduler; add_train_aliases).
void add_sched_flags(FlagSet& fs, TrainOptions& o) {
  fs.integer("--lr-step-size", &o.lr_step_size, 1, "steplr: multiply the LR by --lr-gamma every N epochs",
             std::numeric_limits<int32_t>::max());
  fs.real("--lr-gamma", &o.lr_gamma, 0.0, true, "steplr, multisteplr, exponentiallr: LR decay factor");
  fs.custom(
      "--lr-milestones", "E1,E2,...", "multisteplr: epochs (increasing, > 0) at which the LR is multiplied by --lr-gamma",
      [&o](const std::string& v) { o.lr_milestones = parse_milestones(v); },
      [&o] {
        std::string out;
        for (int64_t m : o.lr_milestones) {
          if (!out.empty()) out += ',';
          out += std::to_string(m);
        }
        return out;
      });
  fs.real("--lr-min", &o.lr_min, 0.0, false, "cosine: minimum LR (CosineAnnealingLR eta_min)");
  fs.integer("--lr-warmup-epochs", &o.lr_warmup_epochs, 0, "epochs of LR warmup before the schedule (0 = none)",
             std::numeric_limits<int32_t>::max());
  fs.enumeration("--lr-warmup-method", &o.lr_warmup_method, warmup_method_names(),
                 "warmup: linear = LinearLR(start_factor = decay), constant = ConstantLR(factor = decay)");
  fs.real("--lr-warmup-decay", &o.lr_warmup_decay, 0.0, true, "warmup: the LR factor it starts from", 1.0);
  fs.boolean("--model-ema", &o.model_ema, "also keep an exponential moving average of the weights and buffers "
                                          "and evaluate it after each epoch (torchvision's --model-ema)");
  fs.integer("--model-ema-steps", &o.model_ema_steps, 1, "EMA: update every N steps of an epoch",
             std::numeric_limits<int32_t>::max());
  fs.real("--model-ema-decay", &o.model_ema_decay, 0.0, false,
          "EMA: decay before torchvision's adjustment by world x batch x steps / epochs", 1.0);
}

// MixUp / CutMix and repeated augmentation: torchvision's references/classification flags.
void add_mix_flags(FlagSet& fs, TrainOptions& o) {
  fs.real("--mixup-alpha", &o.mixup_alpha, 0.0, false,
          "MixUp on each batch with lambda ~ Beta(alpha, alpha) (0 = off; with --cutmix-alpha one of the two per batch)");
  fs.real("--cutmix-alpha", &o.cutmix_alpha, 0.0, false,
          "CutMix on each batch with lambda ~ Beta(alpha, alpha) (0 = off; with --mixup-alpha one of the two per batch)");
  fs.boolean("--ra-sampler", &o.ra_sampler,
             "repeated-augmentation sampler (torchvision's RASampler): each image --ra-reps times per epoch, on "
             "different ranks");
  fs.integer("--ra-reps", &o.ra_reps, 1, "repetitions of each image per epoch under --ra-sampler", 1024);
}

// torchvision's reference presets (references/classification/presets.py), with the
// reference train.py's flag names.
void add_data_flags(FlagSet& fs, TrainOptions& o) {
  fs.integer("--train-crop-size", &o.train_crop_size, 0,
             "train on torchvision's preset: RandomResizedCrop(N) -> RandomHorizontalFlip(--hflip-prob) -> "
             "--auto-augment, instead of --augment -> Resize((S, S)) (0 = off, the tutorial's pipeline)",
             4096);
  fs.real("--hflip-prob", &o.hflip_prob, 0.0, false, "with --train-crop-size: RandomHorizontalFlip probability", 1.0);
  fs.enumeration("--auto-augment", &o.auto_augment, auto_augment_names(),
                 "with --train-crop-size: policy after the flip: imagenet = AutoAugment (what --augment "
                 "autoaugment applies, here with --interpolation), ta_wide = TrivialAugmentWide, "
                 "ra = RandAugment(2 ops, --ra-magnitude)");
  fs.integer("--ra-magnitude", &o.ra_magnitude, 0, "with --auto-augment ra: magnitude bin (of 31)", 30);
  fs.custom(
      "--interpolation", "bilinear",
      "resampling of the preset's crops, resizes and geometric ops (only torchvision's default, bilinear)",
      [](const std::string& v) {
        if (v != "bilinear")
          throw UsageError("--interpolation " + v + ": only bilinear (torchvision's default) is implemented");
      },
      [] { return std::string("bilinear"); });
  fs.integer("--val-resize-size", &o.val_resize_size, 0,
             "evaluate on Resize(R) (shorter side) -> CenterCrop(--val-crop-size) instead of Resize((S, S)) "
             "(0 = off; torchvision: 256)",
             4096);
  fs.integer("--val-crop-size", &o.val_crop_size, 0,
             "evaluation's CenterCrop size (0 = off; torchvision: 224); validation, --eval-only and predict use it",
             4096);
  fs.real("--random-erase", &o.random_erase, 0.0, false,
          "RandomErasing probability (value 0 after Normalize, scale 0.02-0.33, ratio 0.3-3.3)", 1.0);
}

void add_train_flags(FlagSet& fs, TrainOptions& o) {
  add_train_recipe_flags(fs, o);
  add_train_run_flags(fs, o);
  add_sched_flags(fs, o);
  add_mix_flags(fs, o);
  add_data_flags(fs, o);
}

// The spellings of timm's train.py and PyTorch's ImageNet example for the same
// settings, so that a command line carried over from them works. Not every program
// flag is here: only those whose meaning is the same.
void add_train_aliases(FlagSet& fs) {
  fs.alias("-b", "--batch-size");
  fs.alias("-j", "--workers");
  fs.alias("--model", "--arch");
  fs.alias("-a", "--arch");
  fs.alias("--output", "--output-dir");
  fs.alias("--opt", "--optimizer");
  fs.alias("--sched", "--scheduler");
  fs.alias("--lr-scheduler", "--scheduler");  // torchvision
  fs.alias("--wd", "--weight-decay");
  fs.alias("--smoothing", "--label-smoothing");
  fs.alias("--log-interval", "--log-every");
  fs.alias("--print-freq", "--log-every");
}

// The LR schedule's and the EMA's checks across flags.
void check_sched_flags(const TrainOptions& t) {
  const std::string sched = "--scheduler " + name_of(scheduler_names(), t.scheduler);
  if (t.lr_warmup_epochs > 0 && t.scheduler == SchedulerKind::Plateau)
    throw UsageError("--lr-warmup-epochs: not with " + sched +
                     " (ReduceLROnPlateau cannot follow a warmup; use --lr-scheduler "
                     "steplr|multisteplr|cosineannealinglr|exponentiallr|none)");
  if (t.lr_warmup_epochs >= t.epochs)
    throw UsageError("--lr-warmup-epochs " + std::to_string(t.lr_warmup_epochs) + ": must be less than --epochs (" +
                     std::to_string(t.epochs) + ")");
  if (t.scheduler == SchedulerKind::MultiStep && t.lr_milestones.empty())
    throw UsageError("--lr-scheduler multisteplr: needs --lr-milestones (e.g. 30,60,90)");
  if (t.scheduler != SchedulerKind::MultiStep && !t.lr_milestones.empty())
    throw UsageError("--lr-milestones: only with --lr-scheduler multisteplr (this run: " + sched + ")");
}

// The reference presets' flags against each other and the tutorial's (add_data_flags).
void finish_data_flags(TrainOptions& t) {
  // The model's input is at least 32x32 (as --image-size); Resize's side may be smaller
  // (CenterCrop then pads).
  for (auto [flag, value, least] : {std::tuple<const char*, int, int>{"--train-crop-size", t.train_crop_size, 32},
                                    {"--val-resize-size", t.val_resize_size, 8},
                                    {"--val-crop-size", t.val_crop_size, 32}})
    if (value > 0 && value < least)
      throw UsageError(std::string(flag) + " " + std::to_string(value) + ": expected 0 (off) or " +
                       std::to_string(least) + "..4096");
  const bool preset = t.train_crop_size > 0;
  const std::string needs_preset = ": only with --train-crop-size (torchvision's training preset; the tutorial's "
                                   "pipeline augments with --augment)";
  if (!preset && t.auto_augment != AutoAugmentPolicy::None) throw UsageError("--auto-augment" + needs_preset);
  if (!preset && t.was_given("--hflip-prob")) throw UsageError("--hflip-prob" + needs_preset);
  if (preset && t.was_given("--augment") && t.augment != Augment::None)
    throw UsageError("--augment " + name_of(augment_names(), t.augment) +
                     ": the tutorial pipeline's augmentation; with --train-crop-size the preset's are "
                     "--hflip-prob and --auto-augment (imagenet = autoaugment)");
  if (t.was_given("--ra-magnitude") && t.auto_augment != AutoAugmentPolicy::RandAugment)
    throw UsageError("--ra-magnitude: only with --auto-augment ra");
  // One of the evaluation sizes implies the preset; the other takes torchvision's default.
  if (t.val_crop_size > 0 || t.val_resize_size > 0) {
    if (t.val_resize_size == 0) t.val_resize_size = 256;
    if (t.val_crop_size == 0) t.val_crop_size = 224;
  }
}

}  // namespace

void add_train_command_flags(FlagSet& fs, TrainOptions& o) {
  add_train_flags(fs, o);
  add_train_aliases(fs);
  fs.yaml_dialect([](std::vector<FlagSet::ConfigKey>& keys, FlagSet::ConfigTranslation& out) {
    if (looks_like_timm_args(keys)) translate_timm_args(keys, out);
  });
}

void finish_train_options(TrainOptions& t, std::vector<std::string> given, const std::vector<std::string>& words) {
  t.given = std::move(given);
  finish_data_flags(t);
  if (t.data.empty()) throw UsageError("--data: required (ImageFolder root or packed .h5)");
  data::check_split_folder("--train-split", t.train_split);
  data::check_split_folder("--val-split", t.val_split);
  if (t.train_split == t.val_split)
    throw UsageError("--val-split " + t.val_split + ": the same folder as --train-split");
  if (t.resume == ResumeMode::File && t.resume_file.empty())
    throw UsageError("--resume: expected auto, none or a checkpoint path");
  if (t.optimizer != OptimizerKind::Sgd && t.optimizer != OptimizerKind::Lars && t.nesterov)
    throw UsageError("--nesterov: only valid with --optimizer sgd or lars");
  if (t.nesterov && t.momentum <= 0.0) throw UsageError("--nesterov: needs --momentum > 0");
  if (t.skip_unreadable && !t.eval_only)
    throw UsageError("--skip-unreadable: only with --eval-only (training skips unreadable images unless "
                     "--strict-data)");
  if (t.skip_unreadable && t.strict_data) throw UsageError("--skip-unreadable: contradicts --strict-data");
  if (t.init_ema && t.init.empty()) throw UsageError("--init-ema: only with --init FILE (it picks that file's EMA)");
  if (t.eval_only && t.resume == ResumeMode::None && t.init.empty())
    throw UsageError("--eval-only: needs a checkpoint to evaluate (--resume FILE|auto or --init FILE)");
  if (t.precision == Precision::FP16 && t.device == Device::Cpu)
    throw UsageError("--precision: fp16 needs a GPU (--device cuda)");
  if (t.deterministic && t.device == Device::Cuda)
    throw UsageError("--deterministic: only supported on the CPU backend (--device cpu)");
  check_sched_flags(t);
  if (t.lr_base == 0.0)
    for (const char* f : {"--lr-base-size", "--lr-base-scale"})
      if (t.was_given(f)) throw UsageError(std::string(f) + ": only with --lr-base (the lr it scales to the global batch)");
  t.command_line = join_command_line(words);
}

TrainOptions parse_train_command_line(const std::vector<std::string>& words) {
  // As the program reads it: "train", or flags without a command word.
  size_t command_words = 1;
  if (words.size() > 1 && words[1] == "train")
    command_words = 2;
  else if (words.size() < 2 || words[1].rfind("-", 0) != 0)
    throw UsageError("not a train command line: '" + join_command_line(words) + "'");
  std::vector<std::string> recorded(words.begin(), words.begin() + command_words);
  const std::vector<std::string> args(words.begin() + command_words, words.end());
  TrainOptions t;
  FlagSet fs("train");
  add_train_command_flags(fs, t);
  bool help = false;
  std::vector<std::string> given, applied;
  fs.parse(args, false, &help, &given, &applied);
  if (help) throw UsageError("not a training run: '" + join_command_line(words) + "' asks for help");
  recorded.insert(recorded.end(), applied.begin(), applied.end());
  finish_train_options(t, std::move(given), recorded);
  return t;
}

namespace {

bool exists(const std::string& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// Creates the directory (and parents) and proves a file can be written, synced and
// removed there, so a read-only or full filesystem is reported before training.
void probe_writable_dir(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UsageError(flag + ": cannot create directory '" + dir + "': " + ec.message());
  if (!fs::is_directory(dir, ec)) throw UsageError(flag + ": '" + dir + "' is not a directory");
  const std::string probe = (fs::path(dir) / (".write_probe." + std::to_string(getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    throw UsageError(flag + ": cannot write in '" + dir + "': " + std::strerror(errno));
  const char buf[4096] = {};
  const bool ok = ::write(fd, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!ok) throw UsageError(flag + ": cannot write in '" + dir + "': " + std::strerror(err));
}

}  // namespace

void check_train_paths(const TrainOptions& o, bool probe_output) {
  if (!exists(o.data)) throw UsageError("--data: no such file or directory: '" + o.data + "'");
  if (!o.init.empty() && !exists(o.init))
    throw UsageError("--init: no such file: '" + o.init + "'");
  // A legacy .pth cannot be read: say so before MPI starts, with the fix (a zip .pth is read).
  if (!o.init.empty())
    if (const std::string p = io::safetensors::torch_file_problem(o.init); !p.empty())
      throw UsageError("--init: '" + o.init + "' " + p);
  if (o.resume == ResumeMode::File) {
    const std::string& f = o.resume_file;
    if (!exists(f)) throw UsageError("--resume: no such file: '" + f + "'");
    if (fs::is_directory(f)) throw UsageError("--resume: '" + f + "' is a directory, expected a .h5 file");
    if (const std::string p = io::safetensors::torch_file_problem(f); !p.empty())
      throw UsageError("--resume: '" + f + "' " + p +
                       " (a converted file holds weights only: start from it with --init)");
    if (io::safetensors::sniff(f) == io::safetensors::Kind::TorchZip)
      throw UsageError("--resume: '" + f + "' is a PyTorch state_dict (torch.save), which holds weights only "
                       "(no optimizer state to resume): start from it with --init " + f);
  }
  if (probe_output && !o.eval_only) {
    probe_writable_dir("--output-dir", o.output_dir);
    const fs::path metrics = o.metrics_path();
    if (metrics.has_parent_path()) probe_writable_dir("--metrics", metrics.parent_path().string());
  }
}

data::TransformConfig transform_config(const TrainOptions& o) {
  data::TransformConfig tc;
  tc.image_size = o.image_size;
  tc.augment = o.augment;
  tc.train_crop_size = o.train_crop_size;
  tc.hflip_prob = o.hflip_prob;
  tc.auto_augment = o.auto_augment;
  tc.ra_magnitude = o.ra_magnitude;
  tc.interpolation = data::Interpolation::Bilinear;  // --interpolation accepts only this
  tc.val_resize_size = o.val_resize_size;
  tc.val_crop_size = o.val_crop_size;
  tc.random_erase = o.random_erase;
  return tc;
}

int eval_image_size(const TrainOptions& o) { return o.val_crop_size > 0 ? o.val_crop_size : o.image_size; }

std::vector<FlagSet::Value> train_flag_settings(const TrainOptions& o) {
  TrainOptions copy = o;
  FlagSet fs("train");
  add_train_flags(fs, copy);
  add_train_aliases(fs);
  return fs.values();
}

std::vector<std::pair<std::string, std::string>> train_flag_values(const TrainOptions& o) {
  std::vector<std::pair<std::string, std::string>> text;
  for (auto& v : train_flag_settings(o)) text.emplace_back(std::move(v.name), std::move(v.text));
  return text;
}

}  // namespace rd::train
