#include "resnet_ddp/train/cli.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"
#include "resnet_ddp/shell_quote.h"
#include "train/safetensors.h"

namespace fs = std::filesystem;

namespace rd::train {

const char* command_name(Command c) {
  switch (c) {
    case Command::Train: return "train";
    case Command::Predict: return "predict";
    case Command::Info: return "info";
    case Command::Export: return "export";
    case Command::Synth: return "synth";
    case Command::Pack: return "pack";
    case Command::Help: return "help";
    case Command::Version: return "version";
  }
  return "?";
}

bool TrainOptions::was_given(const std::string& flag) const {
  return std::find(given.begin(), given.end(), flag) != given.end();
}

std::string TrainOptions::metrics_path() const {
  if (!metrics.empty()) return metrics;
  return (fs::path(output_dir) / "metrics.csv").string();
}

namespace {

void add_train_flags(FlagSet& fs, TrainOptions& o) {
  fs.path("--data", &o.data, "PATH",
          "dataset: ImageFolder root with Train/ and Validation/, or a .h5 from 'pack' (required)");
  fs.text("--train-split", &o.train_split, "NAME", "folder of the training split under --data (ImageNet-style: train)");
  fs.text("--val-split", &o.val_split, "NAME", "folder of the validation split under --data (ImageNet-style: val)");
  fs.config("--config", "more flags from FILE, one per line ('--batch-size 32' or 'batch-size = 32', # comments); "
                        "the command line wins");
  fs.choice("--arch", &o.arch, {"resnet18", "resnet34", "resnet50", "resnet_tiny"},
            "network depth (resnet_tiny: a miniature model for tests)");
  fs.enumeration("--head", &o.head, head_names(),
            "classifier: mlp = Linear-ReLU-Linear (reference recipe), fc = torchvision's Linear");
  fs.integer("--image-size", &o.image_size, 32, "square input size after Resize", 4096);
  fs.integer("--batch-size", &o.batch_size, 1, "images per rank per step", 65536);
  fs.integer("--val-batch-size", &o.val_batch_size, 0, "images per rank per validation batch (0 = --batch-size)", 65536);
  fs.integer("--epochs", &o.epochs, 1, "number of epochs", 1000000);
  fs.real("--lr", &o.lr, 0.0, true, "learning rate");
  fs.enumeration("--optimizer", &o.optimizer, optimizer_names(), "optimizer (PyTorch semantics)");
  fs.real("--momentum", &o.momentum, 0.0, false, "SGD momentum", 1.0);
  fs.boolean("--nesterov", &o.nesterov, "SGD with Nesterov momentum");
  fs.real("--weight-decay", &o.weight_decay, 0.0, false, "L2 penalty added to the gradient");
  fs.real("--label-smoothing", &o.label_smoothing, 0.0, false, "cross-entropy label smoothing", 1.0);
  fs.enumeration("--scheduler", &o.scheduler, scheduler_names(),
            "LR schedule per epoch: plateau = ReduceLROnPlateau(val loss, factor 0.1, patience 5, "
            "min_lr 1e-8); cosine = CosineAnnealingLR(T_max = epochs)");
  fs.boolean("--sync-bn", &o.sync_bn,
             "batch-norm statistics over all ranks (SyncBatchNorm) [default: on, as the reference recipe]");
  fs.negated("--no-sync-bn", &o.sync_bn, "per-rank batch-norm statistics (plain BatchNorm under DDP)");
  fs.integer("--workers", &o.workers, 1, "data loader threads per rank", 256);
  fs.integer("--threads", &o.threads, 0, "compute threads per rank (0 = node cores / ranks on node)", 1024);
  fs.integer("--seed", &o.seed, 0, "seed for initialisation, sampler order and augmentation",
             std::numeric_limits<int64_t>::max());
  fs.path("--output-dir", &o.output_dir, "DIR", "where last.h5, best_model.h5 and metrics.csv go");
  fs.text("--resume", &o.resume, "auto|none|FILE",
          "auto = continue from OUTPUT_DIR/last.h5 if present; none = start fresh; or a checkpoint");
  fs.path("--init", &o.init, "FILE", "initial weights only: .h5 (e.g. converted ImageNet weights) or .safetensors");
  fs.real("--bucket-mb", &o.bucket_mb, 0.0, true, "gradient all-reduce bucket size in MiB");
  fs.boolean("--progress-thread", &o.progress_thread,
             "drive MPI progress from a helper thread during backward (worth it when a core is spare)");
  fs.integer("--accum-steps", &o.accum_steps, 1, "micro-batches accumulated per optimizer step", 65536);
  fs.choice("--device", &o.device, {"auto", "cpu", "cuda"}, "compute device (auto = CUDA when available)");
  fs.enumeration("--precision", &o.precision, precision_names(),
            "compute precision (fp16 uses dynamic loss scaling)");
  fs.real("--loss-scale", &o.loss_scale, 0.0, true,
          "fp16: initial dynamic loss scale, halved on each overflow (PyTorch GradScaler's init_scale)");
  fs.boolean("--amp", &o.amp, "mixed precision for the device: --precision bf16 on the CPU, fp16 on a GPU");
  fs.on_set("--precision", [&o] { o.amp = false; });  // of --amp and --precision, the later wins
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
  fs.choice("--progress", &o.progress, {"auto", "bar", "lines", "none"},
            "progress display: bar on a terminal, lines (--log-every) otherwise");
  fs.choice("--augment", &o.augment, {"autoaugment", "flip", "none"},
            "training augmentation before Resize (reference: autoaugment)");
  fs.choice("--normalize", &o.normalize, {"none", "imagenet"},
            "input normalisation after ToTensor (imagenet: for --init with ImageNet weights)");
  fs.boolean("--strict-data", &o.strict_data, "any unreadable image is an error instead of a skipped file");
  fs.boolean("--skip-unreadable", &o.skip_unreadable,
             "with --eval-only: skip unreadable validation images (counted, not scored) instead of failing");
  fs.boolean("--jpeg-draft", &o.jpeg_draft,
             "decode JPEGs scaled down by 1/2-1/8 in the DCT domain to >= --image-size (faster for large "
             "photos; pixels differ from torchvision's full decode)");
  fs.choice("--verify-data", &o.verify_data, {"full", "header"},
            "scan check: decode every image before training (full) or read headers only");
  fs.boolean("--check", &o.check,
             "dry run: validate the flags, config file, paths, output folder, device, checkpoint, dataset "
             "(headers) and launcher, then exit (0 = ready, 2 = the problem) without training");
  fs.integer("--checkpoint-every", &o.checkpoint_every, 0,
             "also write OUTPUT_DIR/last.h5 every N optimizer steps inside an epoch (0 = only at epoch ends)",
             std::numeric_limits<int64_t>::max());
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
  fs.alias("--wd", "--weight-decay");
  fs.alias("--smoothing", "--label-smoothing");
  fs.alias("--log-interval", "--log-every");
  fs.alias("--print-freq", "--log-every");
}

void add_predict_flags(FlagSet& fs, PredictOptions& o) {
  fs.path("--checkpoint", &o.checkpoint, "FILE", "checkpoint to load: .h5, or .safetensors from export (required)");
  fs.boolean("--json", &o.json, "print JSON instead of a table");
  fs.choice("--split", &o.split, {"Train", "Validation", "Test"},
            "split to use when an input is a dataset root or a packed .h5");
  fs.integer("--batch-size", &o.batch_size, 1, "images per forward pass", 65536);
  fs.choice("--device", &o.device, {"auto", "cpu", "cuda"}, "compute device");
  fs.integer("--threads", &o.threads, 0, "compute threads (0 = all cores)", 1024);
  fs.integer("--workers", &o.workers, 1, "image decoding threads", 256);
  fs.text("--train-split", &o.train_split, "NAME", "folder of the training split in a dataset root");
  fs.text("--val-split", &o.val_split, "NAME", "folder of the validation split in a dataset root");
  fs.boolean("--skip-unreadable", &o.skip_unreadable,
             "skip inputs that cannot be read as images (counted in the summary, not in the accuracy) "
             "instead of failing on them");
  fs.alias("-b", "--batch-size");
  fs.alias("-j", "--workers");
}

void add_export_flags(FlagSet& fs, ExportOptions& o) {
  fs.path("--checkpoint", &o.checkpoint, "FILE", "checkpoint or --init file to export (required)");
  fs.path("--out", &o.out, "FILE.safetensors", "file to write (required; replaced atomically, never the input)");
}

void add_info_flags(FlagSet& fs, InfoOptions& o) {
  fs.boolean("--tensors", &o.tensors, "also list every tensor with its shape");
  fs.boolean("--json", &o.json, "print JSON instead of text");
}

const char* kTrainUsage =
    "Usage: resnet_ddp [train] --data PATH [flags]\n"
    "       mpirun -np N resnet_ddp --data PATH [flags]\n\n"
    "Trains a ResNet classifier data-parallel over all MPI ranks (one rank per GPU or\n"
    "per share of a CPU node). Defaults reproduce the reference recipe.\n\nFlags:\n";
const char* kPredictUsage =
    "Usage: resnet_ddp predict --checkpoint FILE.h5 [flags] IMAGE... | DIR | DATA.h5\n\n"
    "Classifies images with a trained checkpoint (one process). For each image prints the\n"
    "predicted class and the class probabilities. Over a labelled ImageFolder (DIR/<class>/...,\n"
    "or a dataset root / packed .h5 with --split) it also prints accuracy and the confusion\n"
    "matrix. The class names come from the checkpoint: a dataset root needs only the split\n"
    "it reads. An input that cannot be read as an image is an error (exit 2) unless\n"
    "--skip-unreadable.\n\nFlags:\n";
const char* kInfoUsage =
    "Usage: resnet_ddp info [flags] FILE.h5\n\n"
    "Prints a checkpoint's metadata: format, arch, head, classes, epoch, step, best\n"
    "accuracy, optimizer and scheduler state, and the command line that produced it.\n\nFlags:\n";

const char* kExportUsage =
    "Usage: resnet_ddp export --checkpoint FILE.h5 --out FILE.safetensors\n\n"
    "Writes the model's weights as safetensors with torchvision's state_dict names (float32,\n"
    "num_batches_tracked int64), loadable with safetensors.torch.load_file into torchvision's\n"
    "model with strict=True. The metadata holds the class names, arch, head, image size and\n"
    "normalisation. Optimizer state is not exported. See docs/interop.md.\n\nFlags:\n";

}  // namespace

std::string export_help() {
  ExportOptions o;
  FlagSet fs("export");
  add_export_flags(fs, o);
  return std::string(kExportUsage) + fs.help() + "  --help                      this text\n";
}

std::string train_help() {
  TrainOptions o;
  FlagSet fs("train");
  add_train_flags(fs, o);
  add_train_aliases(fs);
  return std::string(kTrainUsage) + fs.help() + "  --help                      this text\n";
}
std::string predict_help() {
  PredictOptions o;
  FlagSet fs("predict");
  add_predict_flags(fs, o);
  return std::string(kPredictUsage) + fs.help() + "  --help                      this text\n";
}
std::string info_help() {
  InfoOptions o;
  FlagSet fs("info");
  add_info_flags(fs, o);
  return std::string(kInfoUsage) + fs.help() + "  --help                      this text\n";
}

std::string top_level_help() {
  return "Usage: resnet_ddp [COMMAND] [flags]\n\n"
         "Data-parallel ResNet training with MPI (CPU: oneDNN; GPU: CUDA + NCCL).\n\n"
         "Commands:\n"
         "  train      train a model (the default when the first argument is a flag)\n"
         "  predict    classify images with a checkpoint\n"
         "  info       print a checkpoint's metadata\n"
         "  export     write a checkpoint's weights as .safetensors (torchvision names)\n"
         "  synth      write a small synthetic ImageFolder dataset (for tests and demos)\n"
         "  pack       pack an ImageFolder tree into one HDF5 file for fast loading\n\n"
         "Run 'resnet_ddp COMMAND --help' for the flags of a command.\n"
         "Example: mpirun -np 8 resnet_ddp --data /tmp/Dataset_2\n";
}

ParsedCommand parse_command_line(int argc, char** argv) {
  ParsedCommand pc;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    throw UsageError("no command or flags given (the training data is required: --data PATH); "
                     "see resnet_ddp --help");
  }
  std::string first = args.front();
  Command cmd = Command::Train;
  bool consumed_name = true;
  if (first == "train") cmd = Command::Train;
  else if (first == "predict") cmd = Command::Predict;
  else if (first == "info") cmd = Command::Info;
  else if (first == "export") cmd = Command::Export;
  else if (first == "synth") cmd = Command::Synth;
  else if (first == "pack") cmd = Command::Pack;
  else if (first == "help" || first == "--help" || first == "-h") {
    pc.command = Command::Help;
    pc.help_text = top_level_help();
    if (args.size() > 1) {
      const std::string& what = args[1];
      if (what == "train") pc.help_text = train_help();
      else if (what == "predict") pc.help_text = predict_help();
      else if (what == "info") pc.help_text = info_help();
      else if (what == "export") pc.help_text = export_help();
      else if (what == "synth" || what == "pack") {
        pc.command = what == "synth" ? Command::Synth : Command::Pack;
        pc.passthrough = {what, "--help"};
      } else {
        throw UsageError("unknown command '" + what + "'; see resnet_ddp --help");
      }
    }
    return pc;
  } else if (first == "--version" || first == "version") {
    pc.command = Command::Version;
    return pc;
  } else if (first.rfind("-", 0) == 0) {
    cmd = Command::Train;
    consumed_name = false;
  } else {
    throw UsageError("unknown command '" + first +
                     "' (commands: train, predict, info, export, synth, pack; see resnet_ddp --help)");
  }
  if (consumed_name) args.erase(args.begin());
  pc.command = cmd;

  bool help = false;
  switch (cmd) {
    case Command::Train: {
      FlagSet fs("train");
      add_train_flags(fs, pc.train);
      add_train_aliases(fs);
      std::vector<std::string> applied;
      fs.parse(args, false, &help, &pc.train.given, &applied);
      if (help) break;
      TrainOptions& t = pc.train;
      if (t.data.empty()) throw UsageError("--data: required (ImageFolder root or packed .h5)");
      data::check_split_folder("--train-split", t.train_split);
      data::check_split_folder("--val-split", t.val_split);
      if (t.train_split == t.val_split)
        throw UsageError("--val-split " + t.val_split + ": the same folder as --train-split");
      if (t.resume.empty()) throw UsageError("--resume: expected auto, none or a checkpoint path");
      if (t.optimizer != OptimizerKind::Sgd && t.nesterov) throw UsageError("--nesterov: only valid with --optimizer sgd");
      if (t.nesterov && t.momentum <= 0.0) throw UsageError("--nesterov: needs --momentum > 0");
      if (t.skip_unreadable && !t.eval_only)
        throw UsageError("--skip-unreadable: only with --eval-only (training skips unreadable images unless "
                         "--strict-data)");
      if (t.skip_unreadable && t.strict_data)
        throw UsageError("--skip-unreadable: contradicts --strict-data");
      if (t.eval_only && t.resume == "none" && t.init.empty())
        throw UsageError("--eval-only: needs a checkpoint to evaluate (--resume FILE|auto or --init FILE)");
      if (t.precision == Precision::FP16 && t.device == "cpu")
        throw UsageError("--precision: fp16 needs a GPU (--device cuda)");
      if (t.deterministic && t.device == "cuda")
        throw UsageError("--deterministic: only supported on the CPU backend (--device cpu)");
      // With a config file's flags written out: a resume reads them back from the
      // checkpoint, whatever became of the file.
      std::vector<std::string> words{argv[0]};
      if (consumed_name) words.push_back(argv[1]);
      words.insert(words.end(), applied.begin(), applied.end());
      t.command_line = join_command_line(words);
      break;
    }
    case Command::Predict: {
      FlagSet fs("predict");
      add_predict_flags(fs, pc.predict);
      pc.predict.inputs = fs.parse(args, true, &help);
      if (help) break;
      if (pc.predict.checkpoint.empty()) throw UsageError("--checkpoint: required");
      data::check_split_folder("--train-split", pc.predict.train_split);
      data::check_split_folder("--val-split", pc.predict.val_split);
      if (pc.predict.inputs.empty())
        throw UsageError("predict: no input given (image files, a directory, or a packed .h5)");
      break;
    }
    case Command::Info: {
      FlagSet fs("info");
      add_info_flags(fs, pc.info);
      auto pos = fs.parse(args, true, &help);
      if (help) break;
      if (pos.empty()) throw UsageError("info: expected a checkpoint file (resnet_ddp info FILE.h5)");
      if (pos.size() > 1) throw UsageError("info: expected one checkpoint file, got " + std::to_string(pos.size()));
      pc.info.checkpoint = pos.front();
      break;
    }
    case Command::Export: {
      FlagSet fs("export");
      add_export_flags(fs, pc.exp);
      fs.parse(args, false, &help);
      if (help) break;
      if (pc.exp.checkpoint.empty()) throw UsageError("--checkpoint: required (the checkpoint to export)");
      if (pc.exp.out.empty()) throw UsageError("--out: required (the .safetensors file to write)");
      break;
    }
    case Command::Synth:
    case Command::Pack:
      // The data tools parse their own flags (and their own --help).
      pc.passthrough.push_back(command_name(cmd));
      pc.passthrough.insert(pc.passthrough.end(), args.begin(), args.end());
      return pc;
    default:
      break;
  }
  if (help) {
    pc.help_text = cmd == Command::Train     ? train_help()
                   : cmd == Command::Predict ? predict_help()
                   : cmd == Command::Export  ? export_help()
                                             : info_help();
    pc.command = Command::Help;
  }
  return pc;
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
  // A .pth is the likeliest wrong file here: say so before MPI starts, with the fix.
  if (!o.init.empty())
    if (const std::string p = safetensors::torch_file_problem(o.init); !p.empty())
      throw UsageError("--init: '" + o.init + "' " + p);
  if (o.resume != "auto" && o.resume != "none") {
    if (!exists(o.resume)) throw UsageError("--resume: no such file: '" + o.resume + "'");
    if (fs::is_directory(o.resume)) throw UsageError("--resume: '" + o.resume + "' is a directory, expected a .h5 file");
    if (const std::string p = safetensors::torch_file_problem(o.resume); !p.empty())
      throw UsageError("--resume: '" + o.resume + "' " + p +
                       " (a converted file holds weights only: start from it with --init)");
  }
  if (probe_output && !o.eval_only) {
    probe_writable_dir("--output-dir", o.output_dir);
    const fs::path metrics = o.metrics_path();
    if (metrics.has_parent_path()) probe_writable_dir("--metrics", metrics.parent_path().string());
  }
}

void check_predict_paths(const PredictOptions& o) {
  if (!exists(o.checkpoint)) throw UsageError("--checkpoint: no such file: '" + o.checkpoint + "'");
  if (const std::string p = safetensors::torch_file_problem(o.checkpoint); !p.empty())
    throw UsageError("--checkpoint: '" + o.checkpoint + "' " + p);
  for (const auto& in : o.inputs)
    if (!exists(in)) throw UsageError("predict: no such file or directory: '" + in + "'");
}

std::vector<std::pair<std::string, std::string>> train_flag_values(const TrainOptions& o) {
  TrainOptions copy = o;
  FlagSet fs("train");
  add_train_flags(fs, copy);
  add_train_aliases(fs);
  return fs.values();
}

}  // namespace rd::train
