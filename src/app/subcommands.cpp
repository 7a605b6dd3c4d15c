// The resnet_ddp program's subcommand table, the flags of the commands other than
// train (training's stay with the trainer, src/train/cli.cpp, where a resume reads
// them), and the checks each command runs before its main function.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "resnet_ddp/app/commands.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/commands.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/dist/launcher.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"
#include "resnet_ddp/io/safetensors.h"
#include "resnet_ddp/train/commands.h"

namespace fs = std::filesystem;

namespace rd::train {

namespace {

void add_predict_flags(FlagSet& fs, PredictOptions& o) {
  fs.path("--checkpoint", &o.checkpoint, "FILE", "checkpoint to load: .h5, or .safetensors from export (required)");
  fs.boolean("--json", &o.json, "print JSON instead of a table");
  fs.choice("--split", &o.split, {"Train", "Validation", "Test"},
            "split to use when an input is a dataset root or a packed .h5");
  fs.integer("--batch-size", &o.batch_size, 1, "images per forward pass", 65536);
  fs.enumeration("--device", &o.device, device_names(), "compute device");
  fs.integer("--threads", &o.threads, 0, "compute threads (0 = all cores)", 1024);
  fs.integer("--workers", &o.workers, 1, "image decoding threads", 256);
  fs.text("--train-split", &o.train_split, "NAME", "folder of the training split in a dataset root");
  fs.text("--val-split", &o.val_split, "NAME", "folder of the validation split in a dataset root");
  fs.boolean("--skip-unreadable", &o.skip_unreadable,
             "skip inputs that cannot be read as images (counted in the summary, not in the accuracy) "
             "instead of failing on them");
  fs.boolean("--ema", &o.ema, "classify with the checkpoint's weight EMA (/model_ema of a --model-ema run)");
  fs.alias("-b", "--batch-size");
  fs.alias("-j", "--workers");
}

void add_export_flags(FlagSet& fs, ExportOptions& o) {
  fs.path("--checkpoint", &o.checkpoint, "FILE", "checkpoint or --init file to export (required)");
  fs.path("--out", &o.out, "FILE.safetensors", "file to write (required; replaced atomically, never the input)");
  fs.boolean("--ema", &o.ema,
             "export the checkpoint's weight EMA (/model_ema of a --model-ema run) instead of the model's weights");
}

void add_info_flags(FlagSet& fs, InfoOptions& o) {
  fs.boolean("--tensors", &o.tensors, "also list every tensor with its shape");
  fs.boolean("--json", &o.json, "print JSON instead of text");
}

// ---- the subcommand table ----------------------------------------------------------------
// One row per subcommand: how it is named and listed, how its words are read, and what
// runs it. parse_command_line, every --help text and the program's main read this one
// table, so a new subcommand is a row (with its options, flags and main function).

// The words of one subcommand as parse_command_line hands them to its row.
struct Words {
  std::vector<std::string> prefix;  // argv[0] and the command word as typed (a recorded command line)
  std::vector<std::string> args;    // the words after the command word
};

// What FlagSet::parse returned, for a row's checks across flags.
struct Parsed {
  const Words& words;
  std::vector<std::string> positional, given, applied;
};

struct Subcommand {
  Command command;
  std::vector<std::string> names;  // the name, then other spellings
  const char* summary;             // its line in resnet_ddp --help; nullptr: not listed
  const char* usage;               // its --help text above the flag table
  // Declares its flags, targets in `pc`; nullptr for a command that reads its own words.
  void (*flags)(FlagSet& fs, ParsedCommand& pc);
  bool positional;  // takes positional arguments
  // After the flags: positionals and checks across flags (rd::UsageError naming the
  // flag). For a command without flags of its own: the whole reading of its words.
  void (*finish)(ParsedCommand& pc, Parsed& p);
  // Checks that need the filesystem but no MPI, before main; `speaker`: this task probes
  // the output folder. nullptr: none.
  void (*preflight)(const ParsedCommand& pc, bool speaker);
  int (*main)(ParsedCommand& pc, int& argc, char**& argv);
};

// The launcher's task 0 prints help and version; every task parses the same argv.
bool is_speaker() { return dist::launcher_rank() == 0; }

void train_flags(FlagSet& fs, ParsedCommand& pc) { add_train_command_flags(fs, pc.train); }

void train_finish(ParsedCommand& pc, Parsed& p) {
  // With a config file's flags written out: a resume reads them back from the
  // checkpoint, whatever became of the file.
  std::vector<std::string> words = p.words.prefix;
  words.insert(words.end(), p.applied.begin(), p.applied.end());
  finish_train_options(pc.train, std::move(p.given), words);
}

void train_preflight(const ParsedCommand& pc, bool speaker) {
  if (!pc.train.check) check_train_paths(pc.train, speaker);  // --check reports these itself
}

int train_run(ParsedCommand& pc, int& argc, char**& argv) {
  return pc.train.check ? check_main(pc.train) : train_main(pc.train, argc, argv);
}

void predict_finish(ParsedCommand& pc, Parsed& p) {
  PredictOptions& o = pc.predict;
  o.inputs = std::move(p.positional);
  if (o.checkpoint.empty()) throw UsageError("--checkpoint: required");
  data::check_split_folder("--train-split", o.train_split);
  data::check_split_folder("--val-split", o.val_split);
  if (o.inputs.empty()) throw UsageError("predict: no input given (image files, a directory, or a packed .h5)");
}

void info_finish(ParsedCommand& pc, Parsed& p) {
  if (p.positional.empty()) throw UsageError("info: expected a checkpoint file (resnet_ddp info FILE.h5)");
  if (p.positional.size() > 1)
    throw UsageError("info: expected one checkpoint file, got " + std::to_string(p.positional.size()));
  pc.info.checkpoint = p.positional.front();
}

void export_finish(ParsedCommand& pc, Parsed&) {
  if (pc.exp.checkpoint.empty()) throw UsageError("--checkpoint: required (the checkpoint to export)");
  if (pc.exp.out.empty()) throw UsageError("--out: required (the .safetensors file to write)");
}

// The data tools parse their own flags (and their own --help).
void passthrough_finish(ParsedCommand& pc, Parsed& p) {
  pc.passthrough = {p.words.prefix.back()};
  pc.passthrough.insert(pc.passthrough.end(), p.words.args.begin(), p.words.args.end());
}

int run_data_tool(ParsedCommand& pc, int (*tool_main)(int, char**)) {
  std::vector<char*> args;
  for (auto& a : pc.passthrough) args.push_back(a.data());
  args.push_back(nullptr);
  return tool_main(static_cast<int>(pc.passthrough.size()), args.data());
}

const Subcommand* find_listed(const std::string& name);

// `help [COMMAND]`: the top-level text, a command's, or a data tool's own --help.
void help_finish(ParsedCommand& pc, Parsed& p) {
  pc.help_text = top_level_help();
  if (p.words.args.empty()) return;
  const std::string& what = p.words.args.front();
  const Subcommand* sc = find_listed(what);
  if (!sc) throw UsageError("unknown command '" + what + "'; see resnet_ddp --help");
  if (sc->flags) {
    pc.help_text = command_help(sc->command);
  } else {
    pc.command = sc->command;
    pc.passthrough = {what, "--help"};
  }
}

int help_run(ParsedCommand& pc, int&, char**&) {
  if (is_speaker()) std::fputs(pc.help_text.c_str(), stdout);
  return 0;
}

int version_run(ParsedCommand&, int&, char**&) {
  // The backends line lets a login-node pre-flight see whether GPUs can be used.
  if (is_speaker())
    std::printf("resnet_ddp %s\nbackends: cpu, cuda %s\n", RESNET_DDP_VERSION,
                cuda_backend_built() ? "(built)" : "(not built)");
  return 0;
}

void no_words(ParsedCommand&, Parsed&) {}

const std::vector<Subcommand>& table() {
  static const std::vector<Subcommand> rows = {
      {Command::Train, {"train"}, "train a model (the default when the first argument is a flag)",
       "Usage: resnet_ddp [train] --data PATH [flags]\n"
       "       mpirun -np N resnet_ddp --data PATH [flags]\n\n"
       "Trains a ResNet classifier data-parallel over all MPI ranks (one rank per GPU or\n"
       "per share of a CPU node). Defaults reproduce the reference recipe.\n\nFlags:\n",
       train_flags, false, train_finish, train_preflight, train_run},
      {Command::Predict, {"predict"}, "classify images with a checkpoint",
       "Usage: resnet_ddp predict --checkpoint FILE.h5 [flags] IMAGE... | DIR | DATA.h5\n\n"
       "Classifies images with a trained checkpoint (one process). For each image prints the\n"
       "predicted class and the class probabilities. Over a labelled ImageFolder (DIR/<class>/...,\n"
       "or a dataset root / packed .h5 with --split) it also prints accuracy and the confusion\n"
       "matrix. The class names come from the checkpoint: a dataset root needs only the split\n"
       "it reads. An input that cannot be read as an image is an error (exit 2) unless\n"
       "--skip-unreadable.\n\nFlags:\n",
       [](FlagSet& fs, ParsedCommand& pc) { add_predict_flags(fs, pc.predict); }, true, predict_finish,
       [](const ParsedCommand& pc, bool) { check_predict_paths(pc.predict); },
       [](ParsedCommand& pc, int&, char**&) { return predict_main(pc.predict); }},
      {Command::Info, {"info"}, "print a checkpoint's metadata",
       "Usage: resnet_ddp info [flags] FILE.h5\n\n"
       "Prints a checkpoint's metadata: format, arch, head, classes, epoch, step, best\n"
       "accuracy, optimizer and scheduler state, and the command line that produced it.\n\nFlags:\n",
       [](FlagSet& fs, ParsedCommand& pc) { add_info_flags(fs, pc.info); }, true, info_finish, nullptr,
       [](ParsedCommand& pc, int&, char**&) { return info_main(pc.info); }},
      {Command::Export, {"export"}, "write a checkpoint's weights as .safetensors (torchvision names)",
       "Usage: resnet_ddp export --checkpoint FILE.h5 --out FILE.safetensors\n\n"
       "Writes the model's weights as safetensors with torchvision's state_dict names (float32,\n"
       "num_batches_tracked int64), loadable with safetensors.torch.load_file into torchvision's\n"
       "model with strict=True. The metadata holds the class names, arch, head, image size and\n"
       "normalisation. Optimizer state is not exported. See docs/interop.md.\n\nFlags:\n",
       [](FlagSet& fs, ParsedCommand& pc) { add_export_flags(fs, pc.exp); }, false, export_finish, nullptr,
       [](ParsedCommand& pc, int&, char**&) { return export_main(pc.exp); }},
      {Command::Synth, {"synth"}, "write a small synthetic ImageFolder dataset (for tests and demos)", "", nullptr,
       true, passthrough_finish, nullptr,
       [](ParsedCommand& pc, int&, char**&) { return run_data_tool(pc, data::synth_main); }},
      {Command::Pack, {"pack"}, "pack an ImageFolder tree into one HDF5 file for fast loading", "", nullptr, true,
       passthrough_finish, nullptr,
       [](ParsedCommand& pc, int&, char**&) { return run_data_tool(pc, data::pack_main); }},
      {Command::Help, {"help", "--help", "-h"}, nullptr, "", nullptr, true, help_finish, nullptr, help_run},
      {Command::Version, {"version", "--version"}, nullptr, "", nullptr, true, no_words, nullptr, version_run},
  };
  return rows;
}

const Subcommand& row(Command c) {
  for (const auto& r : table())
    if (r.command == c) return r;
  throw std::logic_error("resnet_ddp: no subcommand row for command " + std::to_string(static_cast<int>(c)));
}

const Subcommand* find_any(const std::string& word) {
  for (const auto& r : table())
    if (std::find(r.names.begin(), r.names.end(), word) != r.names.end()) return &r;
  return nullptr;
}

const Subcommand* find_listed(const std::string& name) {
  const Subcommand* r = find_any(name);
  return r && r->summary && r->names.front() == name ? r : nullptr;
}

}  // namespace


const char* command_name(Command c) { return row(c).names.front().c_str(); }

std::string command_help(Command c) {
  const Subcommand& sc = row(c);
  if (!sc.flags) return top_level_help();
  ParsedCommand defaults;
  FlagSet fs(sc.names.front());
  sc.flags(fs, defaults);
  return std::string(sc.usage) + fs.help() + "  --help                      this text\n";
}

std::string top_level_help() {
  std::string list;
  for (const auto& r : table()) {
    if (!r.summary) continue;
    std::string name = r.names.front();
    name.resize(std::max<size_t>(name.size(), 11), ' ');
    list += "  " + name + r.summary + "\n";
  }
  return "Usage: resnet_ddp [COMMAND] [flags]\n\n"
         "Data-parallel ResNet training with MPI (CPU: oneDNN; GPU: CUDA + NCCL).\n\n"
         "Commands:\n" +
         list +
         "\n"
         "Run 'resnet_ddp COMMAND --help' for the flags of a command.\n"
         "Example: mpirun -np 8 resnet_ddp --data /tmp/Dataset_2\n";
}

ParsedCommand parse_command_line(int argc, char** argv) {
  Words w{{argv[0]}, std::vector<std::string>(argv + 1, argv + argc)};
  if (w.args.empty())
    throw UsageError("no command or flags given (the training data is required: --data PATH); see resnet_ddp --help");
  const std::string first = w.args.front();
  const Subcommand* sc = find_any(first);
  if (sc) {
    w.prefix.push_back(first);
    w.args.erase(w.args.begin());
  } else if (first.rfind("-", 0) == 0) {
    sc = &row(Command::Train);  // flags without a command: train
  } else {
    std::string names;
    for (const auto& r : table())
      if (r.summary) names += (names.empty() ? "" : ", ") + r.names.front();
    throw UsageError("unknown command '" + first + "' (commands: " + names + "; see resnet_ddp --help)");
  }
  ParsedCommand pc;
  pc.command = sc->command;
  Parsed p{w, {}, {}, {}};
  if (sc->flags) {
    FlagSet fs(sc->names.front());
    sc->flags(fs, pc);
    bool help = false;
    p.positional = fs.parse(w.args, sc->positional, &help, &p.given, &p.applied);
    pc.warnings = fs.warnings();
    if (is_speaker())
      for (const auto& warning : pc.warnings) std::fprintf(stderr, "resnet_ddp: warning: %s\n", warning.c_str());
    if (help) {
      pc.command = Command::Help;
      pc.help_text = command_help(sc->command);
      return pc;
    }
  }
  sc->finish(pc, p);
  return pc;
}

void preflight(const ParsedCommand& pc, bool speaker) {
  if (const auto check = row(pc.command).preflight) check(pc, speaker);
}

int run_command(ParsedCommand& pc, int& argc, char**& argv) { return row(pc.command).main(pc, argc, argv); }
namespace {

bool exists(const std::string& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

}  // namespace

void check_predict_paths(const PredictOptions& o) {
  if (!exists(o.checkpoint)) throw UsageError("--checkpoint: no such file: '" + o.checkpoint + "'");
  if (const std::string p = io::safetensors::torch_file_problem(o.checkpoint); !p.empty())
    throw UsageError("--checkpoint: '" + o.checkpoint + "' " + p);
  for (const auto& in : o.inputs)
    if (!exists(in)) throw UsageError("predict: no such file or directory: '" + in + "'");
}


}  // namespace rd::train
