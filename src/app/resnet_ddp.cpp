// resnet_ddp: one program for training (mpirun/srun), prediction, checkpoint
// inspection and dataset tools. Flags are parsed before MPI starts so that a typo
// costs no allocation time and prints one message (rank 0), exit status 2. The
// subcommands themselves are rows of the table in src/app/subcommands.cpp.
#include <cstdio>
#include <exception>

#include "resnet_ddp/dist/launcher.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/app/commands.h"

namespace {

int run(int argc, char** argv) {
  using namespace rd::train;
  const bool speaker = rd::dist::launcher_rank() == 0;
  ParsedCommand pc;
  try {
    pc = parse_command_line(argc, argv);
    preflight(pc, speaker);
  } catch (const rd::UsageError& e) {
    // Every task parses the same argv: they agree without communicating, one speaks.
    if (speaker) std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 2;
  }
  return run_command(pc, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rd::UsageError& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 1;
  }
}
