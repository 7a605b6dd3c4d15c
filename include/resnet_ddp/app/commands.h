// The resnet_ddp program's subcommands: their table (src/app/subcommands.cpp), the
// options of the commands other than train, and their entry points. Each entry point
// returns the process exit status: 0 success, 1 runtime failure, 2 bad usage/input
// (rd::dist::kPeerLostExitCode when a peer rank died). Training's options stay with the
// trainer (resnet_ddp/train/cli.h), because a resume reads them.
//
// Every parse error is an rd::UsageError whose message names the flag; the program
// prints it on rank 0 only and exits with status 2 on every rank (all ranks parse the
// same argv, so they agree without communicating).
#pragma once

#include <string>
#include <vector>

#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/train/cli.h"

namespace rd::train {

enum class Command { Train, Predict, Info, Export, Synth, Pack, Help, Version };
const char* command_name(Command c);

struct PredictOptions {
  std::string checkpoint;
  std::vector<std::string> inputs;   // image files, ImageFolder dirs, or a packed .h5
  std::string split = "Validation";  // for a dataset root / packed .h5
  std::string train_split = "Train", val_split = "Validation";  // their folders in a root
  bool json = false;
  int batch_size = 32;
  Device device = Device::Auto;
  int threads = 0;
  int workers = 2;
  // Unreadable inputs are skipped and counted instead of failing the command; either
  // way none is classified (the loader's black stand-in never reaches the output).
  bool skip_unreadable = false;
  bool ema = false;  // classify with the checkpoint's weight EMA (/model_ema)
};

struct InfoOptions {
  std::string checkpoint;
  bool tensors = false;  // also list every tensor with shape
  bool json = false;
};

struct ExportOptions {
  std::string checkpoint;  // any checkpoint or --init file resnet_ddp reads
  std::string out;         // FILE.safetensors
  bool ema = false;        // the checkpoint's weight EMA (/model_ema) instead of the model's weights
};

struct ParsedCommand {
  Command command = Command::Help;
  TrainOptions train;
  PredictOptions predict;
  InfoOptions info;
  ExportOptions exp;
  std::vector<std::string> passthrough;  // argv for synth / pack (subcommand first)
  std::string help_text;                 // for Command::Help
  // The config file's notes (its ignored keys): printed once by rank 0 as parsed.
  std::vector<std::string> warnings;
};

// Parses argv (argv[0] is the program) through the subcommand table. Throws
// rd::UsageError naming the flag. `--help` anywhere (before passthrough subcommands'
// own arguments) yields Command::Help with the matching text.
ParsedCommand parse_command_line(int argc, char** argv);

// `resnet_ddp --help`, and a command's --help (the top-level text for a command whose
// flags another program reads: synth, pack).
std::string top_level_help();
std::string command_help(Command c);

// The predict inputs and checkpoint exist and are files resnet_ddp reads.
void check_predict_paths(const PredictOptions& opts);

// The parsed command's checks that need the filesystem but no MPI (rd::UsageError, to be
// printed by the launcher's task 0 only); `speaker`: this task probes the output folder.
void preflight(const ParsedCommand& pc, bool speaker);
// Runs the parsed command's main function (its row of the subcommand table).
int run_command(ParsedCommand& pc, int& argc, char**& argv);

// `train --check`: validates what a run would use (paths, output folder, device,
// checkpoint, dataset headers, launcher) and exits 0, or 2 naming the first problem.
// No MPI, nothing written.
int check_main(const TrainOptions& opts);
// One process, no MPI.
int predict_main(const PredictOptions& opts);
int info_main(const InfoOptions& opts);
// Checkpoint -> .safetensors with torchvision names (one process, no MPI).
int export_main(const ExportOptions& opts);

}  // namespace rd::train
