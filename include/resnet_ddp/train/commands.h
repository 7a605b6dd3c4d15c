// The trainer's entry point, run by the train row of the program's subcommand table
// (resnet_ddp/app/commands.h). Returns the process exit status: 0 success, 1 runtime
// failure, 2 bad usage/input (rd::dist::kPeerLostExitCode when a peer rank died).
#pragma once

#include "resnet_ddp/train/cli.h"

namespace rd::train {

// Initialises MPI (argc/argv go to MPI_Init), trains, finalises MPI.
int train_main(const TrainOptions& opts, int& argc, char**& argv);

}  // namespace rd::train
