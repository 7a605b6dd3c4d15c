// Entry points of the resnet_ddp subcommands owned by the trainer. Each returns
// the process exit status: 0 success, 1 runtime failure, 2 bad usage/input
// (rd::dist::kPeerLostExitCode when a peer rank died).
#pragma once

#include "resnet_ddp/train/cli.h"

namespace rd::train {

// The parsed command's checks that need the filesystem but no MPI (rd::UsageError, to be
// printed by the launcher's task 0 only); `speaker`: this task probes the output folder.
void preflight(const ParsedCommand& pc, bool speaker);
// Runs the parsed command's main function (its row of the subcommand table).
int run_command(ParsedCommand& pc, int& argc, char**& argv);

// Initialises MPI (argc/argv go to MPI_Init), trains, finalises MPI.
int train_main(const TrainOptions& opts, int& argc, char**& argv);
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
